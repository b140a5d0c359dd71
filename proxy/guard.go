package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/failure"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/tlsconf"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// Sentinel errors of the request guards (mapped in classify).
var (
	// ErrPrefillerDenied: SSRF protection is on and the named prefiller is
	// not on the allowlist (403).
	ErrPrefillerDenied error = failure.New("x-prefiller-host-port is not an allowed prefiller", failure.Outcome{Status: http.StatusForbidden, Precedence: precedenceDenied})
	// ErrCircuitOpen: the prefiller failed repeatedly and is skipped for a
	// cool-down; the request goes straight to local prefill.
	ErrCircuitOpen error = failure.New("prefiller circuit open", failure.Outcome{Status: http.StatusServiceUnavailable, Reason: ReasonCircuitOpen, Precedence: precedenceCircuitOpen})
	// ErrOverloaded: --max-concurrent-requests inference requests are in
	// flight (503).
	ErrOverloaded = errors.New("too many concurrent requests")
	// ErrBodyTooLarge: the request body exceeds --max-request-body-bytes (413).
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrHeadersTooLarge: the request head exceeds --max-header-bytes (431).
	ErrHeadersTooLarge = errors.New("request headers too large")
	// ErrReadTimeout: the request was not read within --read-timeout (408).
	ErrReadTimeout = errors.New("request not read in time")
	// ErrMalformed: the request could not be parsed as HTTP/1.1 (400).
	ErrMalformed = errors.New("malformed request")
)

// ReasonCircuitOpen: the prefiller's circuit breaker is open.
const ReasonCircuitOpen = "circuit_open"

// GuardConfig is the proxy's protection against untrusted input, overload
// and failing prefillers. Start from DefaultGuardConfig.
type GuardConfig struct {
	// Allowlist admits prefillers (--enable-ssrf-protection); nil admits
	// every syntactically valid host:port.
	Allowlist ssrf.Allowlist
	// TrustClientKVParams keeps the client's own connector fields
	// (kv_transfer_params, bootstrap_host ...: connectors.ClientFieldNames)
	// in the bodies sent to engines, for setups where something upstream
	// sends them legitimately (--trust-client-kv-params); with an
	// Allowlist, the addresses they name must be on it. False removes them.
	TrustClientKVParams bool
	// Breaker is the per-prefiller circuit breaker.
	Breaker circuit.Config
	// MaxHeaderBytes bounds the request line and headers (431 above); it
	// is also the read buffer of a connection while it reads a request
	// (released once the request is read), 8 KiB by default (nginx's and
	// Apache's usual header limit).
	MaxHeaderBytes int
	// ReadTimeout bounds reading a request's head and body.
	ReadTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle that long.
	IdleTimeout time.Duration
	// MaxConcurrentRequests bounds inference requests in flight, streams
	// included (503 above); 0 leaves them unbounded.
	MaxConcurrentRequests int
	// MaxBufferedBytes bounds the bytes buffered at once by all
	// connections together: request bodies read whole before they are
	// served (503 past it, before the body is read) and answers read whole
	// (upstream.Budget).
	MaxBufferedBytes int64
	// TLS is the serving and upstream TLS.
	TLS TLSConfig
}

// DefaultGuardConfig returns the defaults.
func DefaultGuardConfig() GuardConfig {
	return GuardConfig{
		Breaker:               circuit.DefaultConfig(),
		MaxHeaderBytes:        8 << 10,
		ReadTimeout:           60 * time.Second,
		IdleTimeout:           90 * time.Second,
		MaxConcurrentRequests: 10000,
		MaxBufferedBytes:      DefaultMaxBufferedBytes,
	}
}

// DefaultMaxBufferedBytes is --max-buffered-bytes outside a container with
// a memory limit, and its most within one.
const DefaultMaxBufferedBytes = 512 << 20

// Validate reports the first invalid setting, as one line.
func (c GuardConfig) Validate() error {
	switch {
	case c.MaxHeaderBytes < 1024:
		return fmt.Errorf("--max-header-bytes must be >= 1024, got %d", c.MaxHeaderBytes)
	case c.ReadTimeout <= 0:
		return fmt.Errorf("--read-timeout must be > 0, got %v", c.ReadTimeout)
	case c.IdleTimeout <= 0:
		return fmt.Errorf("--idle-timeout must be > 0, got %v", c.IdleTimeout)
	case c.MaxConcurrentRequests < 0:
		return fmt.Errorf("--max-concurrent-requests must be >= 0, got %d", c.MaxConcurrentRequests)
	case c.MaxBufferedBytes <= 0:
		return fmt.Errorf("--max-buffered-bytes must be > 0, got %d", c.MaxBufferedBytes)
	}
	if err := c.Breaker.Validate(); err != nil {
		return err
	}
	return c.TLS.Validate()
}

// guard is the proxy's runtime state of GuardConfig.
type guard struct {
	cfg      GuardConfig
	m        *metrics.Guards
	breakers *circuit.Breakers
	inflight atomic.Int64
	buffered *upstream.Budget // --max-buffered-bytes
	bodies   *bodyHolds       // request bodies' share of buffered
	tls      *tlsconf.Server  // nil: plain HTTP
	openMu   sync.Mutex
	open     map[string]struct{} // prefillers whose circuit is not closed
}

func newGuard(cfg GuardConfig, maxBody int, m *metrics.Guards, log zerolog.Logger) (*guard, error) {
	g := &guard{cfg: cfg, m: m, breakers: circuit.New(cfg.Breaker), open: map[string]struct{}{}}
	var gauge prometheus.Gauge
	if m != nil {
		gauge = m.BufferedBytes
	}
	g.buffered = upstream.NewBudget(cfg.MaxBufferedBytes, gauge)
	g.bodies = newBodyHolds(g.buffered, maxBody, cfg.ReadTimeout)
	if cfg.TLS.SecureProxy {
		st, err := tlsconf.NewServer(cfg.TLS.CertPath, log)
		if err != nil {
			return nil, err
		}
		g.tls = st
	}
	return g, nil
}

// acquire admits one more inference request, or reports overload.
func (g *guard) acquire() bool {
	n := g.inflight.Add(1)
	if max := g.cfg.MaxConcurrentRequests; max > 0 && n > int64(max) {
		g.inflight.Add(-1)
		return false
	}
	return true
}

func (g *guard) release() { g.inflight.Add(-1) }

// overloaded answers 503 when --max-concurrent-requests are in flight.
func (p *Proxy) overloaded(rc *fasthttp.RequestCtx) {
	p.reject(rc, metrics.RejectOverloaded, fasthttp.StatusServiceUnavailable,
		fmt.Errorf("%w (--max-concurrent-requests %d)", ErrOverloaded, p.guard.cfg.MaxConcurrentRequests))
	rc.Response.Header.Set("Retry-After", "1")
}

// reject answers a request refused before any upstream leg, counted by
// reason and logged with its request id: the client's X-Request-Id when
// the head was read and it is valid, else a new one; the answer carries
// it too.
func (p *Proxy) reject(rc *fasthttp.RequestCtx, reason string, status int, err error) {
	p.guard.m.Rejected.WithLabelValues(reason).Inc()
	id := requestID(rc.Request.Header.Peek(HeaderRequestID))
	rc.Response.Header.Set(HeaderRequestID, id)
	p.log.Warn().Err(err).Str("request_id", id).Str("reason", reason).Int("status", status).
		Str("remote", rc.RemoteAddr().String()).Msg("request rejected")
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	rc.SetBody(errorBody(status, err))
}

// serverError answers what fasthttp could not read or parse, as JSON
// (fasthttp's Server.ErrorHandler).
func (p *Proxy) serverError(rc *fasthttp.RequestCtx, err error) {
	if c, ok := rc.Conn().(*clientconn.Conn); ok {
		c.Linger() // the request may not have been read whole
	}
	if p.guard.bodies.errorClaim(rc) {
		p.bufferFull(rc)
		return
	}
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		p.reject(rc, metrics.RejectBodyTooLarge, fasthttp.StatusRequestEntityTooLarge,
			fmt.Errorf("%w (--max-request-body-bytes %d)", ErrBodyTooLarge, p.cfg.MaxRequestBodyBytes))
	case errors.As(err, &small):
		p.reject(rc, metrics.RejectHeadersTooLarge, fasthttp.StatusRequestHeaderFieldsTooLarge,
			fmt.Errorf("%w (--max-header-bytes %d)", ErrHeadersTooLarge, p.guard.cfg.MaxHeaderBytes))
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		p.reject(rc, metrics.RejectReadTimeout, fasthttp.StatusRequestTimeout,
			fmt.Errorf("%w (--read-timeout %v)", ErrReadTimeout, p.guard.cfg.ReadTimeout))
	default:
		// Never the parser's own message: it quotes the request (clientconn.SafeParseError).
		p.reject(rc, metrics.RejectMalformed, fasthttp.StatusBadRequest, fmt.Errorf("%w: %w", ErrMalformed, clientconn.SafeParseError(err)))
	}
}

// pickAllowed chooses the prefiller from the header value and, with SSRF
// protection on, checks it against the allowlist; a denied one is counted
// and answered 403 by the caller (classify).
func (p *Proxy) pickAllowed(hv []byte) (string, error) {
	hp, err := pickPrefiller(hv, p.cfg.PrefillerSampling)
	if err != nil {
		return hp, err
	}
	if al := p.guard.cfg.Allowlist; al != nil && !al.Allowed(hp) {
		p.guard.m.Rejected.WithLabelValues(metrics.RejectSSRF).Inc()
		return hp, fmt.Errorf("%w: %w", ErrPrefillerDenied, ssrf.ErrDenied)
	}
	p.warm.Saw(hp, false) // a new prefiller is warmed up (prewarm.Warmer)
	return hp, nil
}

// prefillerLabel is the bounded metric label of an admitted prefiller; a
// refused one gets none, so it never takes a label slot.
func (p *Proxy) prefillerLabel(hp string, err error) string {
	if err != nil {
		return ""
	}
	return p.m.Prefillers.Label(hp)
}

// logValue shortens a client-controlled value for a log line.
func logValue(s string) string {
	if len(s) > 256 {
		return s[:256] + "..."
	}
	return s
}

// allowPrefill asks the prefiller's circuit breaker for a prefill: its
// ticket, whose outcome breakerDone reports, or ErrCircuitOpen (a reason
// to fall back) while the circuit is open. Every choreography asks here.
func (r *request) allowPrefill() (*circuit.Ticket, error) {
	g := r.p.guard
	tk, ok := g.breakers.Allow(r.prefiller)
	if !ok {
		return nil, fmt.Errorf("%w: %s skipped for up to %v", ErrCircuitOpen, logValue(r.prefiller), g.cfg.Breaker.Cooldown)
	}
	return tk, nil
}

// breakerDone reports the outcome of a prefill that tk allowed (nil:
// none was taken) to the prefiller's circuit breaker, and keeps the
// open-circuits gauge current.
func (r *request) breakerDone(tk *circuit.Ticket, err error) {
	if tk == nil {
		return
	}
	tk.Done(breakerResult(err))
	r.p.guard.trackCircuit(r.prefiller)
}

// trackCircuit keeps the open-circuits gauge current for hp.
func (g *guard) trackCircuit(hp string) {
	open := g.breakers.State(hp) != circuit.Closed
	g.openMu.Lock()
	defer g.openMu.Unlock()
	_, was := g.open[hp]
	switch {
	case open && !was:
		g.open[hp] = struct{}{}
	case !open && was:
		delete(g.open, hp)
	}
	g.m.CircuitOpen.Set(float64(len(g.open)))
}

// breakerResult is what a prefill outcome says about the prefiller's
// health: refused or reset (unreachable), timed out or 5xx is a failure; a
// client leaving says nothing; any answer shows it alive.
func breakerResult(err error) circuit.Result {
	switch {
	case err == nil:
		return circuit.Success
	case errors.Is(err, ErrClientGone), errors.Is(err, ErrBadRequest), errors.Is(err, errHedgeLost), errors.Is(err, split.ErrAbandoned):
		return circuit.Neutral
	case errors.Is(err, ErrPrefillUnreachable):
		return circuit.Unreachable // a connect probe can tell when it ends
	case errors.Is(err, ErrPrefillTimeout), errors.Is(err, ErrPrefillServerError):
		return circuit.Failure
	}
	return circuit.Success
}

// localAddrs are the local engine addresses of every data-parallel rank.
func (p *Proxy) localAddrs() []string {
	out := make([]string, p.cfg.DataParallelSize)
	for r := range out {
		out[r] = p.localAddr(r)
	}
	return out
}
