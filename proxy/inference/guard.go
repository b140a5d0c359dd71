package inference

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Sentinel errors of the request guards (mapped in classify; those of a
// prefiller refused are the guard's verdicts).
var (
	// ErrPrefillerDenied: SSRF protection is on and the named prefiller is
	// not on the allowlist (403).
	ErrPrefillerDenied = guard.ErrPrefillerDenied
	// ErrCircuitOpen: the prefiller failed repeatedly and is skipped for a
	// cool-down; the request goes straight to local prefill.
	ErrCircuitOpen = guard.ErrCircuitOpen
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
// and failing prefillers (guard.Config). Start from DefaultGuardConfig.
type GuardConfig = guard.Config

// DefaultGuardConfig returns the defaults (guard.DefaultConfig).
func DefaultGuardConfig() GuardConfig { return guard.DefaultConfig() }

// DefaultMaxBufferedBytes is --max-buffered-bytes outside a container with
// a memory limit, and its most within one (guard's).
const DefaultMaxBufferedBytes = guard.DefaultMaxBufferedBytes

// newGuard returns the guard of cfg, whose request bodies are at most
// maxBody bytes (--max-request-body-bytes), counted in m, its circuit
// breakers told the outcomes of prefills by breakerResult.
func newGuard(cfg GuardConfig, maxBody int, m *metrics.Guards, log zerolog.Logger) (*guard.Guard, error) {
	return guard.New(cfg, guard.Deps{MaxBody: maxBody, Metrics: m, BreakerResult: breakerResult, Log: log})
}

// overloaded answers 503 when --max-concurrent-requests are in flight.
func (p *Proxy) overloaded(rc *fasthttp.RequestCtx) {
	p.Reject(rc, metrics.RejectOverloaded, fasthttp.StatusServiceUnavailable,
		fmt.Errorf("%w (--max-concurrent-requests %d)", ErrOverloaded, p.Cfg.Guard.MaxConcurrentRequests))
	rc.Response.Header.Set("Retry-After", "1")
}

// bufferFull answers a request whose body the budget refused: 503, with
// Retry-After, counted as buffered_bytes.
func (p *Proxy) bufferFull(rc *fasthttp.RequestCtx) {
	p.Reject(rc, metrics.RejectBufferedBytes, fasthttp.StatusServiceUnavailable,
		fmt.Errorf("%w (--max-buffered-bytes %d)", upstream.ErrBufferBudget, p.Cfg.Guard.MaxBufferedBytes))
	rc.Response.Header.Set("Retry-After", "1")
}

// reject answers a request refused before any upstream leg, counted by
// reason and logged with its request id: the client's X-Request-ID when
// the head was read and it is valid, else a new one; the answer carries
// it too.
func (p *Proxy) Reject(rc *fasthttp.RequestCtx, reason string, status int, err error) {
	p.M.Guards.Rejected.WithLabelValues(reason).Inc()
	id := RequestID(rc.Request.Header.Peek(HeaderRequestID))
	rc.Response.Header.Set(HeaderRequestID, id)
	p.Log.Warn().Err(err).Str("request_id", id).Str("reason", reason).Int("status", status).
		Str("remote", rc.RemoteAddr().String()).Msg("request rejected")
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	rc.SetBody(ErrorBody(status, err))
}

// serverError answers what fasthttp could not read or parse, as JSON
// (fasthttp's Server.ErrorHandler).
func (p *Proxy) ServerError(rc *fasthttp.RequestCtx, err error) {
	if c, ok := rc.Conn().(*clientconn.Conn); ok {
		c.Linger() // the request may not have been read whole
	}
	if p.Guard.Bodies().ErrorClaim(rc) {
		p.bufferFull(rc)
		return
	}
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		p.Reject(rc, metrics.RejectBodyTooLarge, fasthttp.StatusRequestEntityTooLarge,
			fmt.Errorf("%w (--max-request-body-bytes %d)", ErrBodyTooLarge, p.Cfg.MaxRequestBodyBytes))
	case errors.As(err, &small):
		p.Reject(rc, metrics.RejectHeadersTooLarge, fasthttp.StatusRequestHeaderFieldsTooLarge,
			fmt.Errorf("%w (--max-header-bytes %d)", ErrHeadersTooLarge, p.Cfg.Guard.MaxHeaderBytes))
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		p.Reject(rc, metrics.RejectReadTimeout, fasthttp.StatusRequestTimeout,
			fmt.Errorf("%w (--read-timeout %v)", ErrReadTimeout, p.Cfg.Guard.ReadTimeout))
	default:
		// Never the parser's own message: it quotes the request (clientconn.SafeParseError).
		p.Reject(rc, metrics.RejectMalformed, fasthttp.StatusBadRequest, fmt.Errorf("%w: %w", ErrMalformed, clientconn.SafeParseError(err)))
	}
}

// pickAllowed chooses the prefiller from the header value and, with SSRF
// protection on, checks it against the allowlist (guard.AdmitPrefiller); a
// denied one is counted and answered 403 by the caller (classify).
func (p *Proxy) pickAllowed(hv []byte) (string, error) {
	hp, err := pickPrefiller(hv, p.Cfg.PrefillerSampling)
	if err != nil {
		return hp, err
	}
	if err := p.Guard.AdmitPrefiller(hp); err != nil {
		return hp, err
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
	return p.M.Prefillers.Label(hp)
}

// breakerResult is what a prefill outcome says about the prefiller's
// health (guard.Deps.BreakerResult): refused or reset (unreachable), timed
// out or 5xx is a failure; a client leaving says nothing; any answer shows
// it alive.
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
	out := make([]string, p.Cfg.DataParallelSize)
	for r := range out {
		out[r] = p.LocalAddr(r)
	}
	return out
}
