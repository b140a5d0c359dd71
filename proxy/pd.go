package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// serveInference runs one inference request: local when no prefiller is
// named, else the sequential prefill→decode handoff with its degradations.
func (p *Proxy) serveInference(rc *fasthttp.RequestCtx, local string, api connectors.API) {
	if !p.guard.acquire() {
		p.overloaded(rc)
		return
	}
	r := p.newRequest(rc, local, api)
	defer func() {
		if !r.detached {
			r.finish()
		}
	}()
	hv := rc.Request.Header.Peek(HeaderPrefiller)
	if len(hv) == 0 {
		r.logAt(zerolog.DebugLevel).Msg("no prefiller named: local")
		r.fail(r.forward(r.body, false))
		return
	}
	hp, err := p.pickAllowed(hv)
	r.prefiller, r.label = hp, p.prefillerLabel(hp, err)
	r.logReady = false // the request's logger gets the prefiller field
	if err != nil {
		r.fallback(err)
		return
	}
	if r.choreograph() {
		return
	}
	res, err := r.guardedPrefill()
	if err != nil {
		r.prefillFailed(err)
		return
	}
	if res.handoff.Done {
		r.answerFromPrefill(res)
		return
	}
	if t := p.cfg.DecodeTPSize; t > 0 && res.handoff.TPSize > t {
		r.fallback(fmt.Errorf("%w: prefill tp_size %d > %d", ErrTPMismatch, res.handoff.TPSize, t))
		return
	}
	if p.kv != nil {
		if res.handoff, err = r.pullKV(res.handoff); err != nil {
			r.kvPullFailed(err)
			return
		}
	}
	body, err := p.seq.DecodeBody(nil, api, r.body, res.handoff)
	if err != nil {
		r.fail(err)
		return
	}
	r.mode, r.handoff = metrics.ModeDisaggregated, &res.handoff
	err = r.forward(body, true)
	if errors.Is(err, ErrKVLoadFailed) {
		r.handoff = nil
		r.fallback(err)
		return
	}
	r.fail(err)
}

// prefillFailed ends a request whose prefill leg failed: a prefiller that
// rejected the request (4xx) has its answer passed on; any other failure
// degrades to a local prefill (see fallback).
func (r *request) prefillFailed(err error) {
	var rej *rejected
	if errors.As(err, &rej) {
		r.logAt(zerolog.InfoLevel).Int("status", rej.status).Msg("prefiller rejected the request; answer passed on")
		r.answer(metrics.ModeDisaggregated, rej.status, rej.contentType, rej.body)
		return
	}
	r.fallback(err)
}

// fallback degrades the request to a local prefill with the original body,
// counted and logged with its reason; or, with --prefill-fallback=false (or
// a reason that is no degradation), answers the error.
func (r *request) fallback(cause error) {
	o := classify(cause)
	if o.reason == "" || !r.p.cfg.PrefillFallback || r.gone() {
		r.fail(cause)
		return
	}
	r.p.m.Fallbacks.WithLabelValues(o.reason).Inc()
	r.obs.reason = o.reason
	r.logAt(zerolog.WarnLevel).Err(cause).Str("reason", o.reason).Msg("degrading to local prefill")
	r.mode = metrics.ModeFallback
	r.fail(r.forward(r.body, false))
}

// fail answers a request that could not be served, unless the answer has
// already started (err nil) or the client left.
func (r *request) fail(err error) {
	if err == nil {
		return
	}
	if r.gone() || errors.Is(err, ErrClientGone) {
		r.leftBeforeAnswer(err)
		return
	}
	o := r.failure(err)
	r.answer(r.mode, o.status, "application/json", errorBody(o.status, err))
}

// leftBeforeAnswer records a client that left before its answer began.
func (r *request) leftBeforeAnswer(err error) {
	r.logAt(zerolog.InfoLevel).Err(err).Msg("client left; upstream legs cancelled")
	r.p.m.ClientDisconnects.WithLabelValues(r.phase()).Inc()
	r.p.m.Requests.WithLabelValues(r.mode, "499").Inc()
	r.obs.status = 499
}

// failure classifies and logs err, which the client is answered with.
func (r *request) failure(err error) outcome {
	o := classify(err)
	r.logAt(zerolog.ErrorLevel).Err(err).Int("status", o.status).Msg("request failed")
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

// answer writes a complete, non-streamed answer.
func (r *request) answer(mode string, status int, contentType string, body []byte) {
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
	r.obs.status = status
}

// answerFromPrefill serves a request whose generation ended on the
// prefill's first token: the prefill answer is the whole answer.
func (r *request) answerFromPrefill(res prefillResult) {
	r.logAt(zerolog.InfoLevel).Msg("generation ended on the first token: answered from the prefill, no decode leg")
	ans, err := connectors.EditObject(nil, res.body, []connectors.Edit{{Key: "kv_transfer_params", Delete: true}})
	if err != nil {
		ans = res.body
	}
	if !r.stream {
		r.answer(metrics.ModeDisaggregated, fasthttp.StatusOK, "application/json", ans)
		return
	}
	sse, ok := connectors.AnswerAsSSE(nil, r.api, ans, r.usage)
	if !ok {
		r.fallback(ErrEOSStream)
		return
	}
	r.answer(metrics.ModeDisaggregated, fasthttp.StatusOK, "text/event-stream", sse)
}

// ErrEOSStream: generation ended on the prefill's first token but the
// client streamed an API whose stream the proxy cannot synthesise.
var ErrEOSStream = errors.New("first-token EOS on an API whose stream cannot be synthesised")

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

// prefill runs the prefill leg on r.prefiller, retrying retryable failures
// with backoff, all within --prefill-timeout.
func (r *request) prefill() (res prefillResult, err error) {
	p := r.p
	body, err := p.seq.PrefillBody(nil, r.api, r.body)
	if err != nil {
		return prefillResult{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	r.mode = metrics.ModeDisaggregated
	g := p.m.Inflight.WithLabelValues(metrics.PhasePrefill)
	g.Inc()
	defer g.Dec()
	done := r.prefillStarted(time.Now())
	defer func() { done(err) }()
	ctx, cancel := context.WithTimeoutCause(r.ctx, p.cfg.PrefillTimeout, ErrPrefillTimeout)
	defer cancel()
	for attempt := 0; ; attempt++ {
		res, err := r.prefillOnce(ctx, body)
		if err == nil || !classify(err).retry || attempt >= p.cfg.PrefillMaxRetries {
			return res, err
		}
		p.m.PrefillRetries.WithLabelValues(r.label).Inc()
		r.logAt(zerolog.WarnLevel).Err(err).Int("attempt", attempt+1).Msg("prefill failed; retrying")
		t := time.NewTimer(p.cfg.PrefillRetryBackoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, prefillTransportErr(fmt.Errorf("%w (after %w)", context.Cause(ctx), err))
		case <-t.C:
		}
	}
}

func (r *request) prefillOnce(ctx context.Context, body []byte) (prefillResult, error) {
	req := r.upstream(r.prefiller, body)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := r.p.tr.Do(ctx, r.prefiller, req, resp); err != nil {
		return prefillResult{}, prefillTransportErr(err)
	}
	switch st := resp.StatusCode(); {
	case st == fasthttp.StatusTooManyRequests:
		return prefillResult{}, ErrPrefillOverloaded
	case st >= 500:
		return prefillResult{}, fmt.Errorf("%w: status %d", ErrPrefillServerError, st)
	case st != fasthttp.StatusOK:
		return prefillResult{}, &rejected{status: st, contentType: string(resp.Header.ContentType()),
			body: append([]byte(nil), resp.Body()...)}
	}
	res := prefillResult{body: append([]byte(nil), resp.Body()...)}
	h, err := r.p.seq.ParsePrefill(r.api, res.body)
	res.handoff = h
	return res, err
}

// errorBody is an OpenAI-style error object.
func errorBody(status int, err error) []byte {
	b := []byte(`{"error":{"message":`)
	b = appendJSONString(b, err.Error())
	b = append(b, `,"type":`...)
	b = appendJSONString(b, fasthttp.StatusMessage(status))
	b = append(b, `,"param":null,"code":`...)
	b = fmt.Appendf(b, "%d}}", status)
	return b
}
