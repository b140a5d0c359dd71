package inference

import (
	"errors"
	"io"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	// chunkdec: the package's tests declare a chunked (an HTTP chunked body).
	"github.com/pd-sidecar/pd-sidecar/proxy/chunked"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
)

// Chunked decode (--decode-chunk-size N; chunked.Run): the decode of a
// chat request runs as a series of non-streamed requests of at most N
// tokens to the local engine, stitched into one answer. It applies, as in
// llm-d, to /v1/chat/completions requests decoded here: decoder-only ones
// (with or without a KV cache source), the decode leg of a nixlv2 split
// (only the first chunk carries the handoff's kv_transfer_params) and a
// local-prefill fallback; not to requests routed by
// x-data-parallel-host-port nor to the decode legs of other connectors.

// decode runs the decode of body on the local engine: chunked when
// chunkPlanFor says so, else one request relayed as it comes (forward,
// whose contract it has).
func (r *request) decode(body []byte, remote bool) error {
	plan, ok := r.chunkPlanFor(body, remote)
	if !ok {
		return r.forward(body, remote)
	}
	return r.decodeChunked(body, remote, plan)
}

// chunkPlanFor reports whether the decode of body is chunked, and how: a
// request chunked decode applies to, whose body chunked.PlanFor cuts.
func (r *request) chunkPlanFor(body []byte, remote bool) (chunked.Plan, bool) {
	n := r.p.cfg.DecodeChunkSize
	if n <= 0 || r.api != connectors.APIChat || r.rc == nil ||
		(remote && r.p.conn.Name() != nixlv2.Name) ||
		len(r.rc.Request.Header.Peek(HeaderDataParallel)) > 0 {
		return chunked.Plan{}, false
	}
	return chunked.PlanFor(body, n)
}

// decodeChunked runs a chunked decode (chunked.Run, whose contract it
// has).
func (r *request) decodeChunked(body []byte, remote bool, plan chunked.Plan) error {
	phase := metrics.PhaseLocal
	if remote {
		phase = metrics.PhaseDecode
	}
	g := r.p.m.Inflight.WithLabelValues(phase)
	r.decodeStarted(remote)
	return chunked.Run(chunked.Deps{
		Metrics:      r.p.m.Chunked,
		BadRequest:   ErrBadRequest,
		DecodeFailed: ErrDecodeFailed,
		ClientGone:   ErrClientGone,
		KVLoadFailed: ErrKVLoadFailed,
		ErrorBody:    chunkErrorBody,
	}, chunkRequest{r}, chunked.Job{
		Plan: plan, Body: body, Stream: r.stream, Usage: r.usage, Remote: remote, Inflight: g,
	})
}

// chunkErrorBody is the sidecar's error object answering err: a failed
// chunk's with its status, another with the status classify gives it.
func chunkErrorBody(err error) []byte {
	var cf *chunked.Failed
	if errors.As(err, &cf) {
		return errorBody(cf.Status, err)
	}
	return errorBody(classify(err).status, err)
}

// chunkRequest is a request's part in its chunked decode.
type chunkRequest struct{ r *request }

// Send implements chunked.Request: the chunk's leg to the local engine,
// its answer read whole.
func (c chunkRequest) Send(body []byte, handoff bool) (chunked.Answer, error) {
	r := c.r
	req := r.upstream(r.local, body)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	sent := time.Now()
	hold, err := r.p.tr.Do(r.ctx, r.local, req, resp)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		return chunked.Answer{}, decodeTransportErr(err)
	}
	defer hold.Release()
	st := resp.StatusCode()
	if handoff {
		r.kvHandoffDone(sent, st == fasthttp.StatusOK)
		if st == fasthttp.StatusInternalServerError && r.kvLoadFailed() {
			return chunked.Answer{}, ErrKVLoadFailed
		}
	}
	buf := resp.Body()
	if st == fasthttp.StatusOK && handoff && r.p.rewriter != nil {
		buf = r.p.rewriter.RewriteAnswer(r.api, buf, *r.handoff)
	}
	return chunked.Answer{Status: st, ContentType: string(resp.Header.ContentType()), Body: append([]byte(nil), buf...)}, nil
}

// Gone implements chunked.Request.
func (c chunkRequest) Gone() bool { return c.r.gone() }

// Answer implements chunked.Request.
func (c chunkRequest) Answer(status int, contentType string, body []byte) {
	r := c.r
	if contentType == "text/event-stream" {
		r.rc.Response.Header.Set("Cache-Control", "no-cache")
	}
	r.answer(r.mode, status, contentType, body)
}

// Stream implements chunked.Request: it answers 200 and hands body to
// fasthttp, whose server goroutine reads it.
func (c chunkRequest) Stream(body io.ReadCloser) bool {
	r := c.r
	if r.leftNow() {
		return false
	}
	rc := r.rc
	rc.SetStatusCode(fasthttp.StatusOK)
	rc.SetContentType("text/event-stream")
	rc.Response.Header.Set("Cache-Control", "no-cache")
	r.answerCounted(r.mode, fasthttp.StatusOK)
	if r.watch.Stop() {
		rc.SetConnectionClose()
	}
	r.detached = true
	setStream(rc, body)
	return true
}

// Watch implements chunked.Request.
func (c chunkRequest) Watch() func() bool {
	r := c.r
	release := clientconn.Hold(r.rc) // the handler returned: the watch's read is no request boundary
	w := r.p.armer.Watch(r.rc.Conn(), r.cancel, time.Now())
	return func() bool {
		pipelined := w.Stop()
		release()
		return pipelined
	}
}

// Left implements chunked.Request.
func (c chunkRequest) Left() { c.r.left() }

// Finish implements chunked.Request.
func (c chunkRequest) Finish(pipelined bool) {
	r := c.r
	if pipelined {
		// A watch took the first byte of the client's next request: the
		// connection cannot serve it; the client sends it again.
		_ = r.rc.Conn().Close()
	}
	r.finish()
}

// Report implements chunked.Request.
func (c chunkRequest) Report(chunks int) { c.r.obs.Chunks = chunks }

// Log implements chunked.Request.
func (c chunkRequest) Log(l zerolog.Level) *zerolog.Event { return c.r.logAt(l) }

var _ chunked.Request = chunkRequest{}
