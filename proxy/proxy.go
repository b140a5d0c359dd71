// Package proxy is the decode-pod sidecar's public face: its configuration
// (Config, DefaultConfig), New, and the Proxy that serves the sidecar's
// routes (Run, Handler). A request's state and the choreographies that
// serve it live in proxy/inference and the packages beside it, and a
// caller names their types and constants there; this package adds the
// sidecar's assembly, and nothing else.
package proxy

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/front"
	"github.com/pd-sidecar/pd-sidecar/proxy/godriver"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvpull"
	"github.com/pd-sidecar/pd-sidecar/proxy/lane"
)

// Config is the sidecar's configuration, as proxy/inference declares it;
// the types it is made of are named by the packages that declare them.
type Config = core.Config

// New returns a Proxy. cfg must be valid (see Config.Validate); m holds the
// collectors, gatherer is what /metrics exports, log receives JSON logs.
func New(cfg Config, conn connectors.Connector, m *metrics.Metrics, gatherer prometheus.Gatherer, log zerolog.Logger) (*Proxy, error) {
	p, err := inference.New(cfg, conn, m, gatherer, log)
	if err != nil {
		return nil, err
	}
	p.UseLanes(lane.New)
	p.UseGoDriver(godriver.Serve)
	return &Proxy{p: p}, nil
}

// Proxy serves the sidecar's routes: fasthttp's goroutine driver and, where
// the event loops run, the lane. Create it with New.
type Proxy struct{ p *inference.Proxy }

// Run listens on every data-parallel rank's port (and the metrics port) and
// serves until ctx is done; then it stops accepting, reports not ready, and
// drains in-flight requests for up to ShutdownGrace. It returns an error
// when a port cannot be bound, a server fails, or the drain timed out.
func (p *Proxy) Run(ctx context.Context) error { return front.Run(ctx, p.p) }

// Handler returns the request handler of data-parallel rank r: the same
// proxy, with rank r's local engine as decoder and passthrough target.
func (p *Proxy) Handler(rank int) fasthttp.RequestHandler { return front.Handler(p.p, rank) }

// SetExtras installs optional collaborators. Call it before Run.
func (p *Proxy) SetExtras(e inference.Extras) { p.p.SetExtras(e) }

// EnableKVPull makes the proxy pull the KV itself between prefill and
// decode. The connector must have the sidecar-pull ability. Call it before
// Run.
func (p *Proxy) EnableKVPull(cfg kvpull.Config, puller *kvtransfer.Puller, m *metrics.KVPull) error {
	return p.p.EnableKVPull(cfg, puller, m)
}

// RunKVProbes probes the KV agents of recently used prefillers every
// interval into pd_sidecar_kv_probe_latency_seconds, until ctx ends. A
// no-op unless EnableKVPull was called.
func (p *Proxy) RunKVProbes(ctx context.Context, every time.Duration) { p.p.RunKVProbes(ctx, every) }

// CircuitState reports the circuit-breaker state of prefiller (host:port):
// "closed", "open" or "half_open"; with --circuit-probe-interval, an open
// circuit being probed reads "open (probing)", and one a probe found back
// "open (probe up)". "" when no breaker is configured (status.CircuitStates).
func (p *Proxy) CircuitState(prefiller string) string { return p.p.Guard.CircuitState(prefiller) }

// CircuitLastProbe is when prefiller's open circuit was last probed (zero:
// not since it opened, or no breaker); status.CircuitStates.
func (p *Proxy) CircuitLastProbe(prefiller string) time.Time {
	return p.p.Guard.CircuitLastProbe(prefiller)
}

// Engine is the local engine's kind and version as it last answered them
// ("" until it did).
func (p *Proxy) Engine() (engine, version string) {
	i := p.p.EngineInfo()
	return i.Engine, i.Version
}

// UnknownKVMembers are the kv_transfer_params members prefill answers
// carried that the connector does not document, sorted (at most 32).
func (p *Proxy) UnknownKVMembers() []string { return p.p.M.Wire.UnknownMemberNames.Values() }

// NotePrefiller tells the proxy that hostport (host:port) is a prefiller
// now (the InferencePool watcher's new Ready pod): with --prefill-prewarm
// it is warmed up, even when seen before. It never blocks.
func (p *Proxy) NotePrefiller(hostport string) { p.p.NotePrefiller(hostport) }

// DefaultConfig returns the defaults, drop-in compatible with llm-d's
// pd-sidecar where the flags overlap.
func DefaultConfig() Config { return core.DefaultConfig() }
