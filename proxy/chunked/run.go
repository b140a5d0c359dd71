package chunked

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"
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
	Recorder
	// Send sends a chunk's body to the local engine and returns its
	// answer. handoff: the chunk carries a split's KV handoff (the first
	// of a remote decode): Send records the handoff's end, and rewrites
	// its 200 answer as the connector asks. An error is a chunk that got
	// no answer (a transport failure), or, for the handoff's chunk,
	// Deps.KVLoadFailed.
	Send(body []byte, handoff bool) (Answer, error)
	// Answer writes the whole answer; an event stream is answered
	// no-cache.
	Answer(status int, contentType string, body []byte)
	// Stream answers status with a no-cache stream of contentType whose
	// body is body: the server reads it, writing out each Read at once,
	// and closes it once it is written or a write failed. False, with
	// nothing answered, when the client has just left.
	Stream(status int, contentType string, body io.ReadCloser) bool
	// Watch watches the client connection while a chunk of a begun stream
	// runs: a client that leaves cancels the chunk. stop ends the watch
	// and reports whether it took the first byte of a pipelined request.
	Watch() (stop func() (pipelined bool))
	// Finish ends the request once its stream is over; pipelined: a watch
	// took the first byte of the client's next request, which the
	// connection cannot serve.
	Finish(pipelined bool)
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
	// Edit, when set, edits the whole JSON answer (the last chunk's
	// answer, which the decode's answer is made of) before it is written;
	// a stream's events are the decode's own.
	Edit func([]byte) []byte
}

// Run runs a chunked decode on the request's goroutine, executing its
// Machine: each chunk sent and its answer read whole in turn; a stream's
// further chunks run as fasthttp's server reads the stream. Like a
// relayed decode it returns nil once the answer is written or streaming,
// an error only while the client has seen nothing (Deps.KVLoadFailed when
// the first chunk of a split could not load the remote KV).
func Run(d Deps, req Request, j Job) error {
	m := NewMachine(d, req, j)
	acts := m.Start()
	for {
		var next []Action
		for _, a := range acts {
			switch a.Op {
			case SendChunk:
				ans, err := req.Send(a.Body, a.Handoff)
				if err != nil {
					next = m.Failed(err)
				} else {
					next = m.Answered(ans)
				}
			case AnswerWhole:
				req.Answer(a.Status, a.ContentType, a.Body)
				return nil
			case BeginStream:
				if !req.Stream(a.Status, a.ContentType, &stream{m: m, req: req, buf: a.Body}) {
					next = m.StreamRefused()
					continue
				}
				return nil
			case Return:
				return a.Err
			}
		}
		acts = next
	}
}

// errorBody is the error object of a failed chunk's event: the engine's
// own error object when it sent one, else the sidecar's.
func (m *Machine) errorBody(err error) []byte {
	var cf *Failed
	if errors.As(err, &cf) {
		if b := bytes.TrimSpace(cf.Body); connectors.IsObject(b) && gjson.ValidBytes(b) {
			return b
		}
	}
	return m.d.ErrorBody(err)
}

// stream is the body of a streamed chunked decode: the server reads it and
// writes (and flushes) each Read, so each chunk's text leaves as soon as it
// is in. While a chunk runs the client connection is watched, and a client
// that leaves cancels it.
type stream struct {
	m         *Machine
	req       Request
	buf       []byte
	off       int
	ended     bool // the stream's last bytes are in buf
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

// step runs the machine from the last bytes written to the next ones:
// the next chunk, its events in buf (and the stream's end when the decode
// ended, or an error event and [DONE] when the chunk failed). It fails
// only when the client left.
func (s *stream) step() error {
	s.buf, s.off = s.buf[:0], 0
	acts := s.m.Written()
	for len(acts) > 0 {
		var next []Action
		for _, a := range acts {
			switch a.Op {
			case SendChunk:
				stop := s.req.Watch()
				ans, err := s.req.Send(a.Body, a.Handoff)
				s.pipelined = stop() || s.pipelined
				if err != nil {
					next = s.m.Failed(err)
				} else {
					next = s.m.Answered(ans)
				}
			case WriteEvents:
				s.buf = append(s.buf, a.Body...)
			case EndStream:
				s.ended = true
			case AbortStream:
				return a.Err
			}
		}
		acts = next
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
	s.m.Closed(s.ended && s.off == len(s.buf))
	s.req.Finish(s.pipelined)
	return nil
}

var _ io.ReadCloser = (*stream)(nil)
