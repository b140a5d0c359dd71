package chunked

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// Deps is what a chunked decode needs of the sidecar. Every field is
// required.
type Deps struct {
	// Metrics are the chunked decode's collectors.
	Metrics *metrics.Chunked
	// BadRequest is the error a body no chunk can be built of is wrapped
	// in (the request path's 400).
	BadRequest error
	// DecodeFailed is the error a Failed chunk wraps.
	DecodeFailed error
	// ClientGone is the error of a client that left: Send may return it
	// (wrapped), Run and a stream's Read return it.
	ClientGone error
	// KVLoadFailed is the error Send returns when a split's first chunk
	// could not load the remote KV and the request is to fall back; Run
	// returns it, the client having seen nothing.
	KVLoadFailed error
	// ErrorBody is the sidecar's error object answering err (a *Failed:
	// answering its status).
	ErrorBody func(err error) []byte
}

// Request is the request a chunked decode runs for. Run calls it on the
// request's goroutine; once the stream began, the stream calls it on the
// server's goroutine that reads the stream.
type Request interface {
	// Send sends a chunk's body to the local engine and returns its
	// answer. handoff: the chunk carries a split's KV handoff (the first
	// of a remote decode): Send records the handoff's end, and rewrites
	// its 200 answer as the connector asks. An error is a chunk that got
	// no answer (a transport failure), or, for the handoff's chunk,
	// Deps.KVLoadFailed.
	Send(body []byte, handoff bool) (Answer, error)
	// Gone reports whether the client left.
	Gone() bool
	// Answer writes the whole answer; an event stream is answered
	// no-cache.
	Answer(status int, contentType string, body []byte)
	// Stream answers 200 with a no-cache event stream whose body is body:
	// the server reads it, writing out each Read at once, and closes it
	// once it is written or a write failed. False, with nothing answered,
	// when the client has just left.
	Stream(body io.ReadCloser) bool
	// Watch watches the client connection while a chunk of a begun stream
	// runs: a client that leaves cancels the chunk. stop ends the watch
	// and reports whether it took the first byte of a pipelined request.
	Watch() (stop func() (pipelined bool))
	// Left records a client that left mid-stream.
	Left()
	// Finish ends the request once its stream is over; pipelined: a watch
	// took the first byte of the client's next request, which the
	// connection cannot serve.
	Finish(pipelined bool)
	// Report puts the decode's chunk count in the request's report.
	Report(chunks int)
	// Log is the request's log at a level (nil when that level is off).
	Log(l zerolog.Level) *zerolog.Event
}

// Answer is the engine's answer to one chunk.
type Answer struct {
	// Status and ContentType are the engine's.
	Status      int
	ContentType string
	// Body is the answer's body, the decode's own from then on.
	Body []byte
}

// Failed is a chunk the engine answered with an error status: before the
// answer began it is the client's answer.
type Failed struct {
	// Status, ContentType and Body are the engine's answer.
	Status      int
	ContentType string
	Body        []byte
	cause       error // Deps.DecodeFailed
}

// Error implements error.
func (e *Failed) Error() string { return fmt.Sprintf("decode chunk answered %d", e.Status) }

// Unwrap returns Deps.DecodeFailed.
func (e *Failed) Unwrap() error { return e.cause }

// Job is one chunked decode.
type Job struct {
	// Plan is how the decode is cut (PlanFor).
	Plan Plan
	// Body is the decode's body; it is only read.
	Body []byte
	// Stream: the client streams; the answer is an event stream, begun
	// once the first chunk is in.
	Stream bool
	// Usage: the stream ends with a usage chunk (include_usage).
	Usage bool
	// Remote: the decode is a split's; its first chunk carries the
	// handoff.
	Remote bool
	// Inflight is the gauge of the decodes in flight of its phase.
	Inflight prometheus.Gauge
}

// run is one chunked decode under way.
type run struct {
	d   Deps
	req Request
	j   Job
	dec *Decode
}

// Run runs a chunked decode. Like a relayed decode it returns nil once
// the answer is written or streaming, an error only while the client has
// seen nothing (Deps.KVLoadFailed when the first chunk of a split could
// not load the remote KV). Each decode is counted and logged once, by
// outcome (metrics.Chunked*).
func Run(d Deps, req Request, j Job) error {
	rn := &run{d: d, req: req, j: j, dec: NewDecode(j.Plan, j.Body)}
	j.Inflight.Inc()
	for {
		if err := rn.next(); err != nil {
			j.Inflight.Dec()
			return rn.failedBeforeAnswer(err)
		}
		if rn.dec.Ended() {
			break
		}
		if j.Stream {
			// The stream carries the first chunk's text now and each
			// further chunk's as it comes.
			if !req.Stream(&stream{rn: rn, buf: rn.dec.OpenEvent(nil)}) {
				j.Inflight.Dec()
				return rn.failedBeforeAnswer(d.ClientGone)
			}
			return nil
		}
	}
	j.Inflight.Dec()
	rn.done(metrics.ChunkedCompleted)
	if j.Stream {
		req.Answer(http.StatusOK, "text/event-stream", rn.dec.CloseEvents(rn.dec.OpenEvent(nil), j.Usage))
		return nil
	}
	req.Answer(http.StatusOK, "application/json", rn.dec.JSON())
	return nil
}

// done counts and logs the decode's outcome.
func (rn *run) done(outcome string) {
	rn.d.Metrics.Decodes.WithLabelValues(outcome).Inc()
	rn.req.Report(rn.dec.Chunks())
	rn.req.Log(zerolog.InfoLevel).Str("outcome", outcome).Int("chunks", rn.dec.Chunks()).Int("completion_tokens", rn.dec.Tokens()).
		Str("finish_reason", rn.dec.Finish()).Msg("chunked decode")
}

// failedBeforeAnswer ends a decode whose chunk failed before the client saw
// anything: an engine's error answer is passed on, other errors are the
// caller's to answer.
func (rn *run) failedBeforeAnswer(err error) error {
	var cf *Failed
	switch {
	case errors.Is(err, rn.d.KVLoadFailed):
		rn.done(metrics.ChunkedFallback)
		return err
	case rn.req.Gone() || errors.Is(err, rn.d.ClientGone):
		rn.done(metrics.ChunkedClientLeft)
		return err
	case errors.As(err, &cf):
		rn.done(metrics.ChunkedFailed)
		rn.req.Log(zerolog.ErrorLevel).Int("chunk", rn.dec.Chunks()).Int("status", cf.Status).Msg("decode chunk failed; the engine's error passed on")
		b := cf.Body
		if !connectors.IsObject(b) {
			b = rn.d.ErrorBody(err)
		}
		rn.req.Answer(cf.Status, "application/json", b)
		return nil
	}
	rn.done(metrics.ChunkedFailed)
	return err
}

// next runs the next chunk and adds its answer.
func (rn *run) next() error {
	first := rn.dec.Chunks() == 0
	body, err := rn.dec.Next()
	if err != nil {
		return fmt.Errorf("%w: %w", rn.d.BadRequest, err)
	}
	rn.d.Metrics.Chunks.Inc()
	a, err := rn.req.Send(body, rn.j.Remote && first)
	if err != nil {
		return err
	}
	if a.Status != http.StatusOK {
		return &Failed{Status: a.Status, ContentType: a.ContentType, Body: a.Body, cause: rn.d.DecodeFailed}
	}
	return rn.dec.Add(a.Body)
}

// errorBody is the error object of a failed chunk's event: the engine's
// own error object when it sent one, else the sidecar's.
func (rn *run) errorBody(err error) []byte {
	var cf *Failed
	if errors.As(err, &cf) {
		if b := bytes.TrimSpace(cf.Body); connectors.IsObject(b) && gjson.ValidBytes(b) {
			return b
		}
	}
	return rn.d.ErrorBody(err)
}

// stream is the body of a streamed chunked decode: the server reads it and
// writes (and flushes) each Read, so each chunk's text leaves as soon as it
// is in. While a chunk runs the client connection is watched, and a client
// that leaves cancels it.
type stream struct {
	rn        *run
	buf       []byte
	off       int
	ended     bool // the stream's last event is in buf
	outcome   string
	pipelined bool // a watch took a byte of a pipelined request
	closed    bool
}

// Read implements io.Reader.
func (s *stream) Read(p []byte) (int, error) {
	for s.off == len(s.buf) {
		if s.ended {
			return 0, io.EOF
		}
		if err := s.step(); err != nil {
			return 0, err
		}
	}
	n := copy(p, s.buf[s.off:])
	s.off += n
	return n, nil
}

// step runs the next chunk and puts its events in buf: its text, and the
// stream's end when the decode ended; or, when the chunk failed, an error
// event and [DONE]. It fails only when the client left.
func (s *stream) step() error {
	rn := s.rn
	s.buf, s.off = s.buf[:0], 0
	stop := rn.req.Watch()
	err := rn.next()
	s.pipelined = stop() || s.pipelined
	switch {
	case rn.req.Gone() || errors.Is(err, rn.d.ClientGone):
		s.outcome = metrics.ChunkedClientLeft
		return rn.d.ClientGone
	case err != nil:
		s.outcome, s.ended = metrics.ChunkedFailed, true
		rn.req.Log(zerolog.ErrorLevel).Err(err).Int("chunk", rn.dec.Chunks()).Msg("decode chunk failed mid-stream; the stream ends with an error event")
		s.buf = append(s.buf, "data: "...)
		s.buf = append(s.buf, rn.errorBody(err)...)
		s.buf = append(s.buf, "\n\ndata: [DONE]\n\n"...)
		return nil
	}
	s.buf = rn.dec.TextEvent(s.buf)
	if rn.dec.Ended() {
		s.outcome, s.ended = metrics.ChunkedCompleted, true
		s.buf = rn.dec.CloseEvents(s.buf, rn.j.Usage)
	}
	return nil
}

// Close implements io.Closer; the server calls it once the body is written
// or a client write failed. It ends the decode and the request.
func (s *stream) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	rn := s.rn
	if !s.ended || s.off < len(s.buf) {
		s.outcome = metrics.ChunkedClientLeft
		rn.req.Left()
	}
	rn.j.Inflight.Dec()
	rn.done(s.outcome)
	rn.req.Finish(s.pipelined)
	return nil
}

var _ io.ReadCloser = (*stream)(nil)
