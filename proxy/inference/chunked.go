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
func (r *Request) Decode(body []byte, remote bool) error {
	plan, ok := r.chunkPlanFor(body, remote)
	if !ok {
		return r.Forward(body, remote)
	}
	return r.decodeChunked(body, remote, plan)
}

// chunkPlanFor reports whether the decode of body is chunked, and how: a
// request chunked decode applies to, whose body chunked.PlanFor cuts.
func (r *Request) chunkPlanFor(body []byte, remote bool) (chunked.Plan, bool) {
	n := r.P.Cfg.DecodeChunkSize
	if n <= 0 || r.Api != connectors.APIChat || r.Rc == nil ||
		(remote && r.P.Conn.Name() != nixlv2.Name) ||
		len(r.Rc.Request.Header.Peek(HeaderDataParallel)) > 0 {
		return chunked.Plan{}, false
	}
	return chunked.PlanFor(body, n)
}

// decodeChunked runs a chunked decode (chunked.Run, whose contract it
// has).
func (r *Request) decodeChunked(body []byte, remote bool, plan chunked.Plan) error {
	phase := metrics.PhaseLocal
	if remote {
		phase = metrics.PhaseDecode
	}
	g := r.P.M.Inflight.WithLabelValues(phase)
	r.DecodeStarted(remote)
	return chunked.Run(chunked.Deps{
		Metrics:      r.P.M.Chunked,
		BadRequest:   ErrBadRequest,
		DecodeFailed: ErrDecodeFailed,
		ClientGone:   ErrClientGone,
		KVLoadFailed: ErrKVLoadFailed,
		ErrorBody:    chunkErrorBody,
	}, chunkRequest{r}, chunked.Job{
		Plan: plan, Body: body, Stream: r.Stream, Usage: r.usage, Remote: remote, Inflight: g,
	})
}

// chunkErrorBody is the sidecar's error object answering err: a failed
// chunk's with its status, another with the status classify gives it.
func chunkErrorBody(err error) []byte {
	var cf *chunked.Failed
	if errors.As(err, &cf) {
		return ErrorBody(cf.Status, err)
	}
	return ErrorBody(classify(err).Status, err)
}

// chunkRequest is a request's part in its chunked decode.
type chunkRequest struct{ r *Request }

// Send implements chunked.Request: the chunk's leg to the local engine,
// its answer read whole.
func (c chunkRequest) Send(body []byte, handoff bool) (chunked.Answer, error) {
	r := c.r
	req := r.Upstream(r.Local, body)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	sent := time.Now()
	hold, err := r.P.Tr.Do(r.Ctx, r.Local, req, resp)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		return chunked.Answer{}, DecodeTransportErr(err)
	}
	defer hold.Release()
	st := resp.StatusCode()
	if handoff {
		r.KvHandoffDone(sent, st == fasthttp.StatusOK)
		if st == fasthttp.StatusInternalServerError && r.KvLoadFailed() {
			return chunked.Answer{}, ErrKVLoadFailed
		}
	}
	buf := resp.Body()
	if st == fasthttp.StatusOK && handoff && r.P.Rewriter != nil {
		buf = r.P.Rewriter.RewriteAnswer(r.Api, buf, *r.Handoff)
	}
	return chunked.Answer{Status: st, ContentType: string(resp.Header.ContentType()), Body: append([]byte(nil), buf...)}, nil
}

// Gone implements chunked.Request.
func (c chunkRequest) Gone() bool { return c.r.Gone() }

// Answer implements chunked.Request.
func (c chunkRequest) Answer(status int, contentType string, body []byte) {
	r := c.r
	if contentType == "text/event-stream" {
		r.Rc.Response.Header.Set("Cache-Control", "no-cache")
	}
	r.Answer(r.Mode, status, contentType, body)
}

// Stream implements chunked.Request: it answers 200 and hands body to
// fasthttp, whose server goroutine reads it.
func (c chunkRequest) Stream(body io.ReadCloser) bool {
	r := c.r
	if r.LeftNow() {
		return false
	}
	rc := r.Rc
	rc.SetStatusCode(fasthttp.StatusOK)
	rc.SetContentType("text/event-stream")
	rc.Response.Header.Set("Cache-Control", "no-cache")
	r.AnswerCounted(r.Mode, fasthttp.StatusOK)
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
	release := clientconn.Hold(r.Rc) // the handler returned: the watch's read is no request boundary
	w := r.P.armer.Watch(r.Rc.Conn(), r.Cancel, time.Now())
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
		_ = r.Rc.Conn().Close()
	}
	r.Finish()
}

// Report implements chunked.Request.
func (c chunkRequest) Report(chunks int) { c.r.Obs.Chunks = chunks }

// Log implements chunked.Request.
func (c chunkRequest) Log(l zerolog.Level) *zerolog.Event { return c.r.LogAt(l) }

var _ chunked.Request = chunkRequest{}
