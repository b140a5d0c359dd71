package inference

import (
	"bytes"
	"net"
	"strconv"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvsource"
	"github.com/pd-sidecar/pd-sidecar/proxy/logvalue"
)

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
// reaches an engine. It is a request feature (kvCacheSource), registered
// while the tier is in use.

// HeaderKVCacheSource names the engine (host:port of its HTTP server, as
// the endpoint picker knows it) whose P2P tier holds the prompt's prefix.
// Client controllable: allowlisted, stripped before forwarding.
const HeaderKVCacheSource = "x-kv-cache-source-host-port"

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

// P2PPort is the P2P port of the engine whose HTTP port is port: with
// data-parallel ranks, rank r's (port = --port + r), else rank 0's, as
// llm-d derives it.
func (p *Proxy) P2PPort(port int) int {
	return kvsource.Ports{HTTP: p.Cfg.Port, Ranks: p.Cfg.DataParallelSize, P2P: p.Cfg.P2P.Port}.P2PPort(port)
}

// kvSource reads r's x-kv-cache-source-host-port (the first) when the P2P
// tier is in use: the engine to pull the prompt's prefix from, or nil. A
// source equal to the prefiller, or, without one, to the rank serving r,
// an unusable value and one the allowlist refuses give nil; every outcome
// but "no header" is counted.
func (r *Request) kvSource(h *fasthttp.RequestHeader) *connectors.P2PPeer {
	p := r.P
	if !p.Cfg.P2P.Enabled {
		return nil
	}
	v := h.Peek(HeaderKVCacheSource)
	if len(bytes.TrimSpace(v)) == 0 {
		return nil
	}
	src, o := kvsource.Decide(string(v), kvsource.Request{
		Prefiller: r.Prefiller, Port: p.Cfg.Port + r.rank(), OwnHost: p.ownHost, Allowlist: p.Cfg.Guard.Allowlist,
	})
	p.M.KVSources.WithLabelValues(o).Inc()
	if o != metrics.KVSourceUsed {
		r.LogAt(zerolog.DebugLevel).Str("kv_cache_source", logvalue.Cut(string(v))).Str("outcome", o).Msg("kv cache source not named")
		return nil
	}
	peer := &connectors.P2PPeer{RequestID: NewUUID(), Host: src.Host, Port: p.P2PPort(src.Port)}
	r.LogAt(zerolog.DebugLevel).Str("kv_cache_source", net.JoinHostPort(peer.Host, strconv.Itoa(peer.Port))).Msg("kv cache source named: remote_kv_source")
	return peer
}

// rank is the data-parallel rank r arrived on (its home engine's).
func (r *Request) rank() int {
	_, port, _ := net.SplitHostPort(r.Home)
	n, _ := strconv.Atoi(port)
	return n - r.P.Cfg.ModelServerPort
}

// kvCacheSource is the KV cache source, a request feature: registered while
// the P2P tier is in use.
type kvCacheSource struct{}

// begin reads the request's x-kv-cache-source-host-port (kvSource): the
// prefill leg's engine, or the local engine of a request none prefills
// remotely, is told to pull the prompt's prefix from there first.
func (kvCacheSource) begin(r *Request, h *fasthttp.RequestHeader) featureUse {
	if peer := r.kvSource(h); peer != nil {
		return &kvSourceUse{peer: peer}
	}
	return nil
}

// kvSourceUse is a request's KV cache source.
type kvSourceUse struct{ peer *connectors.P2PPeer }

// EditPrefill names the source in the prefill leg (remote_kv_source).
func (u *kvSourceUse) EditPrefill(body []byte) ([]byte, error) {
	return connectors.WithKVSource(nil, body, *u.peer)
}

// EditLocal replaces the local request's kv_transfer_params with the
// source alone.
func (u *kvSourceUse) EditLocal(body []byte) ([]byte, error) {
	return connectors.OnlyKVSource(nil, body, *u.peer)
}

// KVSourcePeer is the request's KV cache source (nil: none), for a
// choreography whose legs name it themselves (the offloading connector's).
func (r *Request) KVSourcePeer() *connectors.P2PPeer {
	for _, u := range r.uses {
		if s, ok := u.(*kvSourceUse); ok {
			return s.peer
		}
	}
	return nil
}

var (
	_ requestFeature = kvCacheSource{}
	_ prefillEditor  = (*kvSourceUse)(nil)
	_ localEditor    = (*kvSourceUse)(nil)
)
