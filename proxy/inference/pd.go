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
func (p *Proxy) ServeInference(rc *fasthttp.RequestCtx, local string, api connectors.API) {
	if !p.Guard.Acquire() {
		p.overloaded(rc)
		return
	}
	r := p.newRequest(rc, local, api)
	defer func() {
		if !r.Detached {
			r.Finish()
		}
	}()
	if err := r.pickRank(&rc.Request.Header); err != nil {
		r.Fail(err)
		return
	}
	if err := r.Sanitize(); err != nil {
		r.Fail(err)
		return
	}
	if err := r.encode(); err != nil { // llm-d's encoder stage (encoder.Stage)
		r.Fail(err)
		return
	}
	hv := rc.Request.Header.Peek(HeaderPrefiller)
	if len(hv) == 0 {
		r.LogAt(zerolog.DebugLevel).Msg("no prefiller named: local")
		r.BeginFeatures(&rc.Request.Header)
		r.serveLocal()
		return
	}
	if err := r.NamePrefiller(hv); err != nil {
		r.fallback(err)
		return
	}
	r.BeginFeatures(&rc.Request.Header)
	if r.SplitDeclined() {
		r.serveLocal()
		return
	}
	r.P.splitter(r)
}

// serveLocal runs a request that no prefiller prefills (none named, or
// its split declined) on the local engine, its body as the request
// features edit it (a KV cache source named, for one).
func (r *Request) serveLocal() {
	body, err := r.EditLocal(r.Body)
	if err != nil {
		r.Fail(fmt.Errorf("%w: %w", ErrBadRequest, err))
		return
	}
	r.Fail(r.P.decoder(r, body, false)) // chunked when --decode-chunk-tokens says so
}

// tpGuard refuses a handoff from a prefiller of a larger tensor-parallel
// size than --decode-tp-size (ErrTPMismatch).
func (p *Proxy) tpGuard(h connectors.Handoff) error {
	if t := p.Cfg.DecodeTPSize; t > 0 && h.TPSize > t {
		return fmt.Errorf("%w: prefill tp_size %d > %d", ErrTPMismatch, h.TPSize, t)
	}
	return nil
}

// fallback degrades the request to a local prefill with the original body,
// counted and logged with its reason; or, with --prefill-fallback=false (or
// a reason that is no degradation), answers the error.
func (r *Request) fallback(cause error) {
	if r.Gone() || !r.Degrade(cause) {
		r.Fail(cause)
		return
	}
	r.Fail(r.P.decoder(r, r.Body, false)) // chunked when --decode-chunk-tokens says so
}

// Degrade reports whether cause is a reason to degrade to a local prefill
// (that --prefill-fallback allows), and then counts and logs it: the
// request is a fallback from here.
func (r *Request) Degrade(cause error) bool {
	o := Classify(cause)
	if o.reason == "" || !r.P.Cfg.PrefillFallback {
		return false
	}
	r.Degraded(o.reason, cause)
	return true
}

// Degraded counts and logs a request degraded to a local prefill for
// reason (cause: why): the request is a fallback from here.
func (r *Request) Degraded(reason string, cause error) {
	r.P.M.Fallbacks.WithLabelValues(reason).Inc()
	r.Obs.Reason = reason
	r.Mode = metrics.ModeFallback
	if reason == ReasonSlowPrefill {
		r.LogAt(zerolog.WarnLevel).Str("reason", reason).
			Msg("hedge: the local prefill was ready first; prefill cancelled, answered locally")
		return
	}
	upstream.WithUpstream(r.LogAt(zerolog.WarnLevel).Err(cause), cause).Str("reason", reason).Msg("degrading to local prefill")
}

// PassOn answers with the prefiller's rejection of the request, err (a
// *rejected), as it came.
func (r *Request) PassOn(err error) {
	var rej *Rejected
	if !errors.As(err, &rej) {
		r.Fail(err)
		return
	}
	r.LogAt(zerolog.InfoLevel).Int("status", rej.Status).Msg("prefiller rejected the request; answer passed on")
	r.Answer(metrics.ModeDisaggregated, rej.Status, rej.ContentType, rej.Body)
}

// retrying counts and logs a prefill attempt that failed with err and is
// tried again.
func (r *Request) retrying(attempt int, err error) {
	r.P.M.PrefillRetries.WithLabelValues(r.Label).Inc()
	r.LogAt(zerolog.WarnLevel).Err(err).Int("attempt", attempt).Msg("prefill failed; retrying")
}

// Fail answers a request that could not be served, unless the answer has
// already started (err nil) or the client left.
func (r *Request) Fail(err error) {
	if err == nil {
		return
	}
	if errors.Is(err, ErrClientGone) || r.LeftNow() {
		r.LeftBeforeAnswer(err)
		return
	}
	o := r.Failure(err)
	r.Answer(r.Mode, o.Status, "application/json", ErrorBody(o.Status, err))
	if o.RetryAfter {
		r.RC.Response.Header.Set("Retry-After", "1")
	}
}

// LeftBeforeAnswer records a client that left before its answer began. On
// fasthttp's path its connection is closed with nothing written: fasthttp
// would otherwise write the untouched response, an empty 200.
func (r *Request) LeftBeforeAnswer(err error) {
	r.LogAt(zerolog.InfoLevel).Err(err).Msg("client left; upstream legs cancelled")
	r.P.M.ClientDisconnects.WithLabelValues(r.Phase()).Inc()
	r.P.M.Requests.WithLabelValues(r.Mode, "499").Inc()
	r.Obs.Status = 499
	if r.RC != nil && !r.Detached {
		r.RC.HijackSetNoResponse(true)
		r.RC.Hijack(func(net.Conn) {}) // fasthttp closes the connection after it
	}
}

// Failure classifies and logs err, which the client is answered with.
func (r *Request) Failure(err error) outcome {
	o := Classify(err)
	upstream.WithUpstream(r.LogAt(zerolog.ErrorLevel).Err(err), err).Int("status", o.Status).Msg("request failed")
	if errors.Is(err, upstream.ErrBufferBudget) {
		// Refused for want of buffer room, as a request body is: counted
		// with those, answered 503 with Retry-After.
		r.P.M.Guards.Rejected.WithLabelValues(metrics.RejectBufferedBytes).Inc()
		o.RetryAfter = true
	}
	return o
}

func (r *Request) Phase() string {
	switch {
	case r.Handoff != nil:
		return metrics.PhaseDecode
	case r.Prefiller != "" && r.Mode == metrics.ModeDisaggregated:
		return metrics.PhasePrefill
	}
	return metrics.PhaseLocal
}

// Answer writes a complete, non-streamed answer, unless the client left.
func (r *Request) Answer(mode string, status int, contentType string, body []byte) {
	if r.LeftNow() {
		r.LeftBeforeAnswer(ErrClientGone)
		return
	}
	rc := r.RC
	rc.SetStatusCode(status)
	rc.SetContentType(contentType)
	rc.SetBody(body)
	r.AnswerCounted(mode, status)
}

// AnswerCounted records a complete answer of status written now: its TTFT
// when it is no error, the request counter, the report's status.
func (r *Request) AnswerCounted(mode string, status int) {
	if status < 400 {
		r.P.M.TTFT.WithLabelValues(mode).Observe(time.Since(r.Start).Seconds())
	}
	r.P.M.Requests.WithLabelValues(mode, StatusLabel(status)).Inc()
	r.Obs.Status = status
}

// PrefillAnswer is the whole answer of a request whose generation ended on
// the prefill's first token: the prefill's answer without its
// kv_transfer_params, as a stream when the client streams (ErrEOSStream
// for an API whose stream cannot be synthesised).
func (r *Request) PrefillAnswer(res PrefillResult) (contentType string, body []byte, err error) {
	r.LogAt(zerolog.InfoLevel).Msg("generation ended on the first token: answered from the prefill, no decode leg")
	ans, err := connectors.EditObject(nil, res.body, []connectors.Edit{{Key: "kv_transfer_params", Delete: true}})
	if err != nil {
		ans = res.body
	}
	if !r.Stream {
		return "application/json", ans, nil
	}
	sse, ok := connectors.AnswerAsSSE(nil, r.API, ans, r.Usage)
	if !ok {
		return "", nil, ErrEOSStream
	}
	return "text/event-stream", sse, nil
}

// ErrEOSStream: generation ended on the prefill's first token but the
// client streamed an API whose stream the proxy cannot synthesise.
var ErrEOSStream error = failure.New("first-token EOS on an API whose stream cannot be synthesised", failure.Outcome{Status: http.StatusBadGateway, Reason: ReasonEOSUnsupported})

// PrefillResult is a successful prefill exchange.
type PrefillResult struct {
	Handoff connectors.Handoff
	body    []byte
}

// Rejected is a prefill 4xx, answered to the client verbatim.
type Rejected struct {
	Status      int
	ContentType string
	Body        []byte
}

func (e *Rejected) Error() string { return fmt.Sprintf("prefiller answered %d", e.Status) }
func (e *Rejected) Unwrap() error { return ErrPrefillRejected }

// PrefillAnswered is what a prefill answer of status, contentType and body
// (the caller's to give) says: the handoff, or why there is none.
func (r *Request) PrefillAnswered(status int, contentType, body []byte) (PrefillResult, error) {
	switch {
	case status == fasthttp.StatusTooManyRequests:
		return PrefillResult{}, ErrPrefillOverloaded
	case status >= 500:
		return PrefillResult{}, fmt.Errorf("%w: status %d", ErrPrefillServerError, status)
	case status != fasthttp.StatusOK && status < 400:
		// A 204, a 304...: no prefill answer, and nothing for the client.
		return PrefillResult{}, fmt.Errorf("%w: %w: status %d", connectors.ErrBadPrefillAnswer, upstream.ErrBadUpstreamAnswer, status)
	case status != fasthttp.StatusOK:
		return PrefillResult{}, &Rejected{Status: status, ContentType: string(contentType), Body: body}
	}
	h, err := r.P.Seq.ParsePrefill(r.API, body)
	if err == nil {
		err = r.P.checkHandoff(r.Prefiller, h) // its addresses against the allowlist
	}
	if err != nil {
		h = connectors.Handoff{} // nothing of a refused answer goes on
	}
	r.awaitKVRead(h, err) // only a checked handoff is released
	return PrefillResult{Handoff: h, body: body}, err
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

// ErrorBody is an OpenAI-style error object, saying clientMessage(err).
func ErrorBody(status int, err error) []byte {
	b := []byte(`{"error":{"message":`)
	b = appendJSONString(b, clientMessage(err))
	b = append(b, `,"type":`...)
	b = appendJSONString(b, errorType(status))
	b = append(b, `,"param":null,"code":`...)
	b = fmt.Appendf(b, "%d}}", status)
	return b
}
