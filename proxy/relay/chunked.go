package relay

import (
	"io"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	// chunkdec: the package's tests declare a chunked (an HTTP chunked body).

	"github.com/pd-sidecar/pd-sidecar/proxy/chunked"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
)

// Chunked decode (--decode-chunk-size N; proxy/chunked): the decode of a
// chat request runs as a series of non-streamed requests of at most N
// tokens to the local engine, stitched into one answer; where it applies
// is Request.ChunkPlan's. On fasthttp's handler goroutine chunked.Run
// executes the decode's machine through chunkRequest.

// Decode runs the decode of body on the local engine: chunked when
// Request.ChunkPlan says so, else one request relayed as it comes
// (Forward, whose contract it has).
func Decode(r *Exchange, body []byte, remote bool) error {
	plan, ok := r.R.ChunkPlan(body, remote)
	if !ok || r.RC == nil {
		return Forward(r, body, remote)
	}
	r.R.DecodeStarted(remote)
	// chunked.Run has the contract of Forward.
	return chunked.Run(r.R.P.ChunkDeps(), chunkRequest{r}, r.R.ChunkJob(plan, body, remote))
}

// chunkRequest is a request's part in its chunked decode.
type chunkRequest struct{ r *Exchange }

// Send implements chunked.Request: the chunk's leg to the local engine,
// its answer read whole.
func (c chunkRequest) Send(body []byte, handoff bool) (chunked.Answer, error) {
	r := c.r
	req := r.Upstream(r.R.Local, body)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	sent := time.Now()
	hold, err := r.R.P.Tr.Do(r.R.Ctx, r.R.Local, req, resp)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		return chunked.Answer{}, core.DecodeTransportErr(err)
	}
	defer hold.Release()
	st := resp.StatusCode()
	if handoff {
		if err := r.R.KVAnswered(sent, st); err != nil {
			return chunked.Answer{}, err
		}
	}
	buf := r.R.ChunkAnswer(st, resp.Body(), handoff)
	return chunked.Answer{Status: st, ContentType: string(resp.Header.ContentType()), Body: append([]byte(nil), buf...)}, nil
}

// Gone implements chunked.Request.
func (c chunkRequest) Gone() bool { return c.r.R.Gone() }

// Answer implements chunked.Request.
func (c chunkRequest) Answer(status int, contentType string, body []byte) {
	r := c.r
	if contentType == "text/event-stream" {
		r.RC.Response.Header.Set("Cache-Control", "no-cache")
	}
	r.Answer(r.R.Mode, status, contentType, body)
}

// Stream implements chunked.Request: it answers status and hands body to
// fasthttp, whose server goroutine reads it.
func (c chunkRequest) Stream(status int, contentType string, body io.ReadCloser) bool {
	r := c.r
	if r.LeftNow() {
		return false
	}
	rc := r.RC
	rc.SetStatusCode(status)
	rc.SetContentType(contentType)
	rc.Response.Header.Set("Cache-Control", "no-cache")
	r.R.AnswerCounted(r.R.Mode, status)
	if r.Watch.Stop() {
		rc.SetConnectionClose()
	}
	r.R.Detached = true
	SetStream(rc, body)
	return true
}

// Watch implements chunked.Request.
func (c chunkRequest) Watch() func() bool {
	r := c.r
	release := clientconn.Hold(r.RC) // the handler returned: the watch's read is no request boundary
	w := r.P.Armer.Watch(r.RC.Conn(), r.R.Cancel, time.Now())
	return func() bool {
		pipelined := w.Stop()
		release()
		return pipelined
	}
}

// Left implements chunked.Request.
func (c chunkRequest) Left() { Left(c.r.R) }

// Finish implements chunked.Request.
func (c chunkRequest) Finish(pipelined bool) {
	r := c.r
	if pipelined {
		// A watch took the first byte of the client's next request: the
		// connection cannot serve it; the client sends it again.
		_ = r.RC.Conn().Close()
	}
	r.Finish()
}

// Report implements chunked.Request.
func (c chunkRequest) Report(chunks int) { c.r.R.Obs.Chunks = chunks }

// Log implements chunked.Request.
func (c chunkRequest) Log(l zerolog.Level) *zerolog.Event { return c.r.R.LogAt(l) }

var _ chunked.Request = chunkRequest{}
