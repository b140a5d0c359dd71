package inference

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
	"github.com/valyala/fasthttp"
)

// ServeInference runs one inference request that fasthttp's handler
// goroutine serves, by the driver New's caller registered (UseGoDriver).
func (p *Proxy) ServeInference(rc *fasthttp.RequestCtx, local string, api connectors.API) {
	p.goDriver(p, rc, local, api)
}

// Overloaded answers core.ErrOverloaded's outcome (503, with Retry-After) when
// --max-concurrent-requests are in flight.
func (p *Proxy) Overloaded(rc *fasthttp.RequestCtx) {
	p.refuse(rc, metrics.RejectOverloaded,
		fmt.Errorf("%w (--max-concurrent-requests %d)", core.ErrOverloaded, p.Cfg.Guard.MaxConcurrentRequests))
}

// bufferFull answers a request whose body the budget refused with
// upstream.ErrBufferBudget's outcome (503, with Retry-After), counted as
// buffered_bytes.
func bufferFull(p *Proxy, rc *fasthttp.RequestCtx) {
	p.refuse(rc, metrics.RejectBufferedBytes,
		fmt.Errorf("%w (--max-buffered-bytes %d)", upstream.ErrBufferBudget, p.Cfg.Guard.MaxBufferedBytes))
}

// refuse rejects a request (Reject) with the outcome of err: its status,
// and Retry-After where the outcome says so.
func (p *Proxy) refuse(rc *fasthttp.RequestCtx, reason string, err error) {
	o := failure.Of(err)
	p.Reject(rc, reason, o.Status, err)
	if o.RetryAfter {
		rc.Response.Header.Set("Retry-After", "1")
	}
}

// reject answers a request refused before any upstream leg, counted by
// reason and logged with its request id: the client's X-Request-ID when
// the head was read and it is valid, else a new one; the answer carries
// it too.
func (p *Proxy) Reject(rc *fasthttp.RequestCtx, reason string, status int, err error) {
	p.M.Guards.Rejected.WithLabelValues(reason).Inc()
	id := core.RequestID(rc.Request.Header.Peek(core.HeaderRequestID))
	rc.Response.Header.Set(core.HeaderRequestID, id)
	p.Log.Warn().Err(err).Str("request_id", id).Str("reason", reason).Int("status", status).
		Str("remote", rc.RemoteAddr().String()).Msg("request rejected")
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	rc.SetBody(core.ErrorBody(status, err))
}

// serverError answers what fasthttp could not read or parse, as JSON
// (fasthttp's Server.ErrorHandler).
func (p *Proxy) ServerError(rc *fasthttp.RequestCtx, err error) {
	if c, ok := rc.Conn().(*clientconn.Conn); ok {
		c.Linger() // the request may not have been read whole
	}
	if p.Guard.Bodies().ErrorClaim(rc) {
		bufferFull(p, rc)
		return
	}
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		p.Reject(rc, metrics.RejectBodyTooLarge, fasthttp.StatusRequestEntityTooLarge,
			fmt.Errorf("%w (--max-request-body-bytes %d)", core.ErrBodyTooLarge, p.Cfg.MaxRequestBodyBytes))
	case errors.As(err, &small):
		p.Reject(rc, metrics.RejectHeadersTooLarge, fasthttp.StatusRequestHeaderFieldsTooLarge,
			fmt.Errorf("%w (--max-header-bytes %d)", core.ErrHeadersTooLarge, p.Cfg.Guard.MaxHeaderBytes))
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		p.Reject(rc, metrics.RejectReadTimeout, fasthttp.StatusRequestTimeout,
			fmt.Errorf("%w (--read-timeout %v)", core.ErrReadTimeout, p.Cfg.Guard.ReadTimeout))
	default:
		// Never the parser's own message: it quotes the request (clientconn.SafeParseError).
		p.Reject(rc, metrics.RejectMalformed, fasthttp.StatusBadRequest, fmt.Errorf("%w: %w", core.ErrMalformed, clientconn.SafeParseError(err)))
	}
}
