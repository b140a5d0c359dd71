package core

// llm-d's P2P KV tier (vLLM's OffloadingConnector P2P tier): every engine
// serves the blocks it holds on a P2P listener, rank r of a pod on
// P2PConfig.Port+r. The endpoint picker may name, in
// x-kv-cache-source-host-port, an engine that already holds the prompt's
// prefix; when the tier is in use (the offloading connector, or nixlv2 with
// --enable-p2p-pull) the engine that prefills is told to pull that prefix
// first (remote_kv_source): the prefill leg's engine on a split, the local
// engine on a request without a prefiller. A source that is the prefiller
// itself, or (without a prefiller) the rank serving the request, is not
// named; one the SSRF allowlist refuses is ignored (kvsource.Decide). Each
// outcome is counted (pd_sidecar_kv_sources_total). The header never
// reaches an engine. It is a request feature (kvsource.Feature), registered
// while the tier is in use.

// DefaultP2PPort is llm-d's default P2P port (--p2p-connector-port).
const DefaultP2PPort = 7777

// P2PConfig configures the P2P KV tier.
type P2PConfig struct {
	// Enabled honours x-kv-cache-source-host-port; set for the offloading
	// connector, and for nixlv2 with --enable-p2p-pull.
	Enabled bool
	// Port is the engines' P2P port of data-parallel rank 0
	// (--p2p-connector-port); rank r's is Port+r.
	Port int
}
