package inference

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/failure"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// serveInference runs one inference request: local when no prefiller is
// named, else the sequential prefill→decode handoff with its degradations.
func (p *Proxy) serveInference(rc *fasthttp.RequestCtx, local string, api connectors.API) {
	if !p.guard.Acquire() {
		p.overloaded(rc)
		return
	}
	r := p.newRequest(rc, local, api)
	defer func() {
		if !r.detached {
			r.finish()
		}
	}()
	if err := r.pickRank(&rc.Request.Header); err != nil {
		r.fail(err)
		return
	}
	if err := r.sanitize(); err != nil {
		r.fail(err)
		return
	}
	if err := r.encode(); err != nil { // llm-d's encoder stage (encoder.Stage)
		r.fail(err)
		return
	}
	hv := rc.Request.Header.Peek(HeaderPrefiller)
	if len(hv) == 0 {
		r.logAt(zerolog.DebugLevel).Msg("no prefiller named: local")
		r.beginFeatures(&rc.Request.Header)
		r.serveLocal()
		return
	}
	if err := r.namePrefiller(hv); err != nil {
		r.fallback(err)
		return
	}
	r.beginFeatures(&rc.Request.Header)
	if r.splitDeclined() {
		r.serveLocal()
		return
	}
	if r.choreograph() {
		return
	}
	r.runSequential()
}

// serveLocal runs a request that no prefiller prefills (none named, or
// its split declined) on the local engine, its body as the request
// features edit it (a KV cache source named, for one).
func (r *request) serveLocal() {
	body, err := r.editLocal(r.body)
	if err != nil {
		r.fail(fmt.Errorf("%w: %w", ErrBadRequest, err))
		return
	}
	r.fail(r.decode(body, false)) // chunked when --decode-chunk-tokens says so
}

// tpGuard refuses a handoff from a prefiller of a larger tensor-parallel
// size than --decode-tp-size (ErrTPMismatch).
func (p *Proxy) tpGuard(h connectors.Handoff) error {
	if t := p.cfg.DecodeTPSize; t > 0 && h.TPSize > t {
		return fmt.Errorf("%w: prefill tp_size %d > %d", ErrTPMismatch, h.TPSize, t)
	}
	return nil
}

// fallback degrades the request to a local prefill with the original body,
// counted and logged with its reason; or, with --prefill-fallback=false (or
// a reason that is no degradation), answers the error.
func (r *request) fallback(cause error) {
	if r.gone() || !r.degrade(cause) {
		r.fail(cause)
		return
	}
	r.fail(r.decode(r.body, false)) // chunked when --decode-chunk-tokens says so
}

// degrade reports whether cause is a reason to degrade to a local prefill
// (that --prefill-fallback allows), and then counts and logs it: the
// request is a fallback from here.
func (r *request) degrade(cause error) bool {
	o := classify(cause)
	if o.reason == "" || !r.p.cfg.PrefillFallback {
		return false
	}
	r.degraded(o.reason, cause)
	return true
}

// degraded counts and logs a request degraded to a local prefill for
// reason (cause: why): the request is a fallback from here.
func (r *request) degraded(reason string, cause error) {
	r.p.m.Fallbacks.WithLabelValues(reason).Inc()
	r.obs.Reason = reason
	r.mode = metrics.ModeFallback
	if reason == ReasonSlowPrefill {
		r.logAt(zerolog.WarnLevel).Str("reason", reason).
			Msg("hedge: the local prefill was ready first; prefill cancelled, answered locally")
		return
	}
	upstream.WithUpstream(r.logAt(zerolog.WarnLevel).Err(cause), cause).Str("reason", reason).Msg("degrading to local prefill")
}

// passOn answers with the prefiller's rejection of the request, err (a
// *rejected), as it came.
func (r *request) passOn(err error) {
	var rej *rejected
	if !errors.As(err, &rej) {
		r.fail(err)
		return
	}
	r.logAt(zerolog.InfoLevel).Int("status", rej.status).Msg("prefiller rejected the request; answer passed on")
	r.answer(metrics.ModeDisaggregated, rej.status, rej.contentType, rej.body)
}

// retrying counts and logs a prefill attempt that failed with err and is
// tried again.
func (r *request) retrying(attempt int, err error) {
	r.p.m.PrefillRetries.WithLabelValues(r.label).Inc()
	r.logAt(zerolog.WarnLevel).Err(err).Int("attempt", attempt).Msg("prefill failed; retrying")
}

// fail answers a request that could not be served, unless the answer has
// already started (err nil) or the client left.
func (r *request) fail(err error) {
	if err == nil {
		return
	}
	if errors.Is(err, ErrClientGone) || r.leftNow() {
		r.leftBeforeAnswer(err)
		return
	}
	o := r.failure(err)
	r.answer(r.mode, o.status, "application/json", errorBody(o.status, err))
	if o.retryAfter {
		r.rc.Response.Header.Set("Retry-After", "1")
	}
}

// leftBeforeAnswer records a client that left before its answer began. On
// fasthttp's path its connection is closed with nothing written: fasthttp
// would otherwise write the untouched response, an empty 200.
func (r *request) leftBeforeAnswer(err error) {
	r.logAt(zerolog.InfoLevel).Err(err).Msg("client left; upstream legs cancelled")
	r.p.m.ClientDisconnects.WithLabelValues(r.phase()).Inc()
	r.p.m.Requests.WithLabelValues(r.mode, "499").Inc()
	r.obs.Status = 499
	if r.rc != nil && !r.detached {
		r.rc.HijackSetNoResponse(true)
		r.rc.Hijack(func(net.Conn) {}) // fasthttp closes the connection after it
	}
}

// failure classifies and logs err, which the client is answered with.
func (r *request) failure(err error) outcome {
	o := classify(err)
	upstream.WithUpstream(r.logAt(zerolog.ErrorLevel).Err(err), err).Int("status", o.status).Msg("request failed")
	if errors.Is(err, upstream.ErrBufferBudget) {
		// Refused for want of buffer room, as a request body is: counted
		// with those, answered 503 with Retry-After.
		r.p.m.Guards.Rejected.WithLabelValues(metrics.RejectBufferedBytes).Inc()
		o.retryAfter = true
	}
	return o
}

func (r *request) phase() string {
	switch {
	case r.handoff != nil:
		return metrics.PhaseDecode
	case r.prefiller != "" && r.mode == metrics.ModeDisaggregated:
		return metrics.PhasePrefill
	}
	return metrics.PhaseLocal
}

// answer writes a complete, non-streamed answer, unless the client left.
func (r *request) answer(mode string, status int, contentType string, body []byte) {
	if r.leftNow() {
		r.leftBeforeAnswer(ErrClientGone)
		return
	}
	rc := r.rc
	rc.SetStatusCode(status)
	rc.SetContentType(contentType)
	rc.SetBody(body)
	r.answerCounted(mode, status)
}

// answerCounted records a complete answer of status written now: its TTFT
// when it is no error, the request counter, the report's status.
func (r *request) answerCounted(mode string, status int) {
	if status < 400 {
		r.p.m.TTFT.WithLabelValues(mode).Observe(time.Since(r.start).Seconds())
	}
	r.p.m.Requests.WithLabelValues(mode, statusLabel(status)).Inc()
	r.obs.Status = status
}

// prefillAnswer is the whole answer of a request whose generation ended on
// the prefill's first token: the prefill's answer without its
// kv_transfer_params, as a stream when the client streams (ErrEOSStream
// for an API whose stream cannot be synthesised).
func (r *request) prefillAnswer(res prefillResult) (contentType string, body []byte, err error) {
	r.logAt(zerolog.InfoLevel).Msg("generation ended on the first token: answered from the prefill, no decode leg")
	ans, err := connectors.EditObject(nil, res.body, []connectors.Edit{{Key: "kv_transfer_params", Delete: true}})
	if err != nil {
		ans = res.body
	}
	if !r.stream {
		return "application/json", ans, nil
	}
	sse, ok := connectors.AnswerAsSSE(nil, r.api, ans, r.usage)
	if !ok {
		return "", nil, ErrEOSStream
	}
	return "text/event-stream", sse, nil
}

// ErrEOSStream: generation ended on the prefill's first token but the
// client streamed an API whose stream the proxy cannot synthesise.
var ErrEOSStream error = failure.New("first-token EOS on an API whose stream cannot be synthesised", failure.Outcome{Status: http.StatusBadGateway, Reason: ReasonEOSUnsupported})

// prefillResult is a successful prefill exchange.
type prefillResult struct {
	handoff connectors.Handoff
	body    []byte
}

// rejected is a prefill 4xx, answered to the client verbatim.
type rejected struct {
	status      int
	contentType string
	body        []byte
}

func (e *rejected) Error() string { return fmt.Sprintf("prefiller answered %d", e.status) }
func (e *rejected) Unwrap() error { return ErrPrefillRejected }

// prefillAnswered is what a prefill answer of status, contentType and body
// (the caller's to give) says: the handoff, or why there is none.
func (r *request) prefillAnswered(status int, contentType, body []byte) (prefillResult, error) {
	switch {
	case status == fasthttp.StatusTooManyRequests:
		return prefillResult{}, ErrPrefillOverloaded
	case status >= 500:
		return prefillResult{}, fmt.Errorf("%w: status %d", ErrPrefillServerError, status)
	case status != fasthttp.StatusOK && status < 400:
		// A 204, a 304...: no prefill answer, and nothing for the client.
		return prefillResult{}, fmt.Errorf("%w: %w: status %d", connectors.ErrBadPrefillAnswer, upstream.ErrBadUpstreamAnswer, status)
	case status != fasthttp.StatusOK:
		return prefillResult{}, &rejected{status: status, contentType: string(contentType), body: body}
	}
	h, err := r.p.seq.ParsePrefill(r.api, body)
	if err == nil {
		err = r.p.checkHandoff(r.prefiller, h) // its addresses against the allowlist
	}
	if err != nil {
		h = connectors.Handoff{} // nothing of a refused answer goes on
	}
	r.awaitKVRead(h, err) // only a checked handoff is released
	return prefillResult{handoff: h, body: body}, err
}

// errorType names status in the one vocabulary of every error body the
// sidecar writes: OpenAI's client error classes, as vLLM's own error bodies
// use them (BadRequestError, NotFoundError, InternalServerError...), and
// the same PascalCase "...Error" shape for the statuses they lack.
func errorType(status int) string {
	switch status {
	case 400:
		return "BadRequestError"
	case 401:
		return "AuthenticationError"
	case 403:
		return "PermissionDeniedError"
	case 404:
		return "NotFoundError"
	case 405:
		return "MethodNotAllowedError"
	case 408:
		return "RequestTimeoutError"
	case 409:
		return "ConflictError"
	case 413:
		return "RequestTooLargeError"
	case 422:
		return "UnprocessableEntityError"
	case 429:
		return "RateLimitError"
	case 431:
		return "RequestHeaderFieldsTooLargeError"
	case 499:
		return "ClientClosedRequestError"
	case 501:
		return "NotImplementedError"
	case 502:
		return "BadGatewayError"
	case 503:
		return "ServiceUnavailableError"
	case 504:
		return "GatewayTimeoutError"
	case 505:
		return "HTTPVersionNotSupportedError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

// errorBody is an OpenAI-style error object, saying clientMessage(err).
func errorBody(status int, err error) []byte {
	b := []byte(`{"error":{"message":`)
	b = appendJSONString(b, clientMessage(err))
	b = append(b, `,"type":`...)
	b = appendJSONString(b, errorType(status))
	b = append(b, `,"param":null,"code":`...)
	b = fmt.Appendf(b, "%d}}", status)
	return b
}
