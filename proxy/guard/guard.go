// Package guard is the proxy's protection against untrusted input,
// overload and failing prefillers, kept at run time: the bound on
// inference requests in flight, the buffer budget that request bodies and
// answers read whole draw from (with the holds of request bodies fasthttp
// reads before the handler runs), the prefiller allowlist (SSRF
// protection), the per-prefiller circuit breakers every choreography asks
// before a prefill and the open circuits a connect probe may end, and the
// TLS of the serving ports.
//
// Its verdicts are errors (ErrPrefillerDenied, ErrCircuitOpen) that say
// what was refused, with their outcomes; the refusal's answer itself is
// the proxy's.
package guard

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/tlsconf"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// Sentinel errors of the guard's verdicts.
var (
	// ErrPrefillerDenied: SSRF protection is on and the named prefiller is
	// not on the allowlist.
	ErrPrefillerDenied error = failure.New("x-prefiller-host-port is not an allowed prefiller", failure.Outcome{Status: http.StatusForbidden, Precedence: failure.PrecedenceDenied})
	// ErrCircuitOpen: the prefiller failed repeatedly and is skipped for a
	// cool-down; the request goes straight to local prefill.
	ErrCircuitOpen error = failure.New("prefiller circuit open", failure.Outcome{Status: http.StatusServiceUnavailable, Reason: failure.ReasonCircuitOpen, Precedence: failure.PrecedenceCircuitOpen})
)

// Deps is what a Guard needs besides its Config.
type Deps struct {
	// MaxBody is --max-request-body-bytes: what a chunked request body
	// reserves of the budget until it is read (BodyHolds).
	MaxBody int
	// Metrics are the guard's collectors: refusals, the open circuits,
	// the probes, the bytes buffered. Nil only for a guard that refuses
	// no prefiller, reports no prefill and records no probe.
	Metrics *metrics.Guards
	// BreakerResult is what a prefill's outcome says about its
	// prefiller's health (BreakerDone). Nil: an error is a failure, none
	// a success.
	BreakerResult func(err error) circuit.Result
	// Log receives the reloads of the serving certificate.
	Log zerolog.Logger
}

// Guard is the proxy's runtime state of Config. Safe for concurrent use.
type Guard struct {
	cfg      Config
	m        *metrics.Guards
	result   func(error) circuit.Result
	breakers *circuit.Breakers
	inflight atomic.Int64
	buffered *upstream.Budget // --max-buffered-bytes
	bodies   *BodyHolds       // request bodies' share of buffered
	tls      *tlsconf.Server  // nil: plain HTTP
	openMu   sync.Mutex
	open     map[string]struct{} // prefillers whose circuit is not closed
}

// New returns the guard of cfg, which must be valid (Config.Validate); it
// fails only when the serving certificate of --secure-proxy cannot be
// loaded or made.
func New(cfg Config, d Deps) (*Guard, error) {
	g := &Guard{cfg: cfg, m: d.Metrics, result: d.BreakerResult, breakers: circuit.New(cfg.Breaker), open: map[string]struct{}{}}
	if g.result == nil {
		g.result = defaultResult
	}
	var gauge prometheus.Gauge
	if d.Metrics != nil {
		gauge = d.Metrics.BufferedBytes
	}
	g.buffered = upstream.NewBudget(cfg.MaxBufferedBytes, gauge)
	g.bodies = newBodyHolds(g.buffered, d.MaxBody, cfg.ReadTimeout)
	if cfg.TLS.SecureProxy {
		st, err := tlsconf.NewServer(cfg.TLS.CertPath, d.Log)
		if err != nil {
			return nil, err
		}
		g.tls = st
	}
	return g, nil
}

func defaultResult(err error) circuit.Result {
	if err != nil {
		return circuit.Failure
	}
	return circuit.Success
}

// Config is the configuration the guard was made with.
func (g *Guard) Config() Config { return g.cfg }

// Acquire admits one more inference request, or reports overload
// (--max-concurrent-requests in flight); an admitted one is let go with
// Release.
func (g *Guard) Acquire() bool {
	n := g.inflight.Add(1)
	if max := g.cfg.MaxConcurrentRequests; max > 0 && n > int64(max) {
		g.inflight.Add(-1)
		return false
	}
	return true
}

// Release ends a request Acquire admitted.
func (g *Guard) Release() { g.inflight.Add(-1) }

// Budget is --max-buffered-bytes, which request bodies and the answers
// read whole draw from.
func (g *Guard) Budget() *upstream.Budget { return g.buffered }

// Bodies are the request bodies' holds on the budget.
func (g *Guard) Bodies() *BodyHolds { return g.bodies }

// AdmitPrefiller checks prefiller hp against the allowlist when SSRF
// protection is on: a denied one is counted (ssrf) and refused with
// ErrPrefillerDenied.
func (g *Guard) AdmitPrefiller(hp string) error {
	if al := g.cfg.Allowlist; al != nil && !al.Allowed(hp) {
		g.m.Rejected.WithLabelValues(metrics.RejectSSRF).Inc()
		return fmt.Errorf("%w: %w", ErrPrefillerDenied, ssrf.ErrDenied)
	}
	return nil
}

// Secure reports whether the serving ports speak TLS (--secure-proxy).
func (g *Guard) Secure() bool { return g.tls != nil }

// WrapListener serves ln over TLS when --secure-proxy is on.
func (g *Guard) WrapListener(ln net.Listener) net.Listener {
	if g.tls == nil {
		return ln
	}
	return tls.NewListener(ln, g.tls.Config())
}
