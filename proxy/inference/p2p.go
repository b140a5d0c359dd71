package inference

import (
	"bytes"
	"net"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
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
func (p *Proxy) P2PPort(port int) int { return p.p2pPorts().P2PPort(port) }

// p2pPorts are the pod's engines' HTTP and P2P ports.
func (p *Proxy) p2pPorts() kvsource.Ports {
	return kvsource.Ports{HTTP: p.Cfg.Port, Ranks: p.Cfg.DataParallelSize, P2P: p.Cfg.P2P.Port}
}

// kvCacheSource is the KV cache source, a request feature: registered while
// the P2P tier is in use. It reads the request's x-kv-cache-source-host-port
// (the first): the engine to pull the prompt's prefix from. A source equal
// to the prefiller, or, without one, to the rank serving the request, an
// unusable value and one the allowlist refuses are not named; every
// outcome but "no header" is counted. The prefill leg's engine, or the
// local engine of a request none prefills remotely, is told to pull the
// prefix from the source first.
type kvCacheSource struct {
	ports     kvsource.Ports
	allowlist kvsource.Allowlist
	ownHost   func(host string) bool
	outcomes  *prometheus.CounterVec // pd_sidecar_kv_sources_total
	newID     func() string          // the P2P transfer's request id
}

// Begin names the request's source, when one is usable.
func (s kvCacheSource) Begin(r feature.Request, h *fasthttp.RequestHeader) feature.Use {
	v := h.Peek(HeaderKVCacheSource)
	if len(bytes.TrimSpace(v)) == 0 {
		return nil
	}
	src, o := kvsource.Decide(string(v), kvsource.Request{
		Prefiller: r.Prefiller, Port: r.Port, OwnHost: s.ownHost, Allowlist: s.allowlist,
	})
	s.outcomes.WithLabelValues(o).Inc()
	if o != metrics.KVSourceUsed {
		r.Log.LogAt(zerolog.DebugLevel).Str("kv_cache_source", logvalue.Cut(string(v))).Str("outcome", o).Msg("kv cache source not named")
		return nil
	}
	peer := &connectors.P2PPeer{RequestID: s.newID(), Host: src.Host, Port: s.ports.P2PPort(src.Port)}
	r.Log.LogAt(zerolog.DebugLevel).Str("kv_cache_source", net.JoinHostPort(peer.Host, strconv.Itoa(peer.Port))).Msg("kv cache source named: remote_kv_source")
	return &kvSourceUse{peer: peer}
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

// KVSource is the source named.
func (u *kvSourceUse) KVSource() *connectors.P2PPeer { return u.peer }

var (
	_ feature.Feature       = kvCacheSource{}
	_ feature.PrefillEditor = (*kvSourceUse)(nil)
	_ feature.LocalEditor   = (*kvSourceUse)(nil)
	_ feature.KVSourceNamer = (*kvSourceUse)(nil)
)
