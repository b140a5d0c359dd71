package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// doneEvent is the [DONE] terminator as it appears in a held preamble.
var doneEvent = []byte("data: [DONE]")

// maxChunk bounds the events coalesced into one client write.
const maxChunk = 32 << 10

// sseBody is the client-facing body of a streamed answer. fasthttp's server
// goroutine reads it and writes (and flushes) every Read as one chunk, so
// no extra goroutine, pipe or buffer is kept per open stream. Each Read
// returns the held preamble first, then the next upstream event, plus any
// further events already buffered: events that arrived together leave in
// one write, and no event ever waits for a later one. Close, which fasthttp
// calls when the body is done or the client write failed, ends the
// upstream leg and the request — unless the stream was handed to an event
// loop after loopAfter (loopStream), which then owns both.
type sseBody struct {
	r       *Exchange
	er      *sse.Reader
	leg     *upstream.Leg
	fn      func([]byte) []byte // per-payload rewrite (nil: none)
	held    []byte
	out     []byte  // the chunk being written: a pooled buffer (outp), or nil
	outp    *[]byte // out's pool entry
	off     int
	first   bool
	done    bool // [DONE] seen
	ended   bool // the stream is complete (or ended with an error event)
	release func()

	// Hand-over to an event loop (loopStream): cc is set when the stream
	// may go, once it has streamed loopAfter; handedOver once it went.
	cc         *clientconn.Conn
	keepAlive  bool
	handedOver bool
	// pipelined: a watch of the client (watchClient) took the first byte
	// of its next request; the connection closes after this answer.
	pipelined bool
}

// NewSSEBody streams er's events after held; release frees the leg and
// finishes the request, once.
func NewSSEBody(r *Exchange, er *sse.Reader, leg *upstream.Leg, held []byte, remote bool, release func()) *sseBody {
	b := &sseBody{r: r, er: er, leg: leg, held: held, first: true, release: release,
		done: bytes.Contains(held, doneEvent)}
	if remote {
		b.fn = r.R.AnswerEdit()
	} else {
		b.fn = r.R.LocalAnswerEdit()
	}
	if !b.loopable() {
		b.cc = nil
	}
	er.Long = b.watchClient
	return b
}

// watchClient watches the client connection while the reader assembles a
// long event: nothing is written to the client meanwhile, so no failed
// write can tell that it left; the watch (clientconn.Watch) does, and cancels the
// request, which closes the upstream connection at once: the engine sees
// the cancel, and the sidecar reads no more of it. The watch is armed
// only once the assembly has lasted clientconn.WatchDelay, so a long event that
// arrives whole costs no goroutine.
func (b *sseBody) watchClient() (stop func()) {
	r := b.r
	release := clientconn.Hold(r.RC)
	w := r.P.Armer.Watch(r.RC.Conn(), r.R.Cancel, time.Now())
	return func() {
		if w.Stop() {
			b.pipelined, b.cc = true, nil // the connection cannot move now
		}
		release()
	}
}

// firstWritten runs after the answer's first write: it records the TTFT
// and, for a stream that may go to an event loop, bounds the wait for the
// engine's next bytes, so that the stream goes once it has run loopAfter.
// (Not before the first write: the answer's head is still in fasthttp's
// buffer until then.)
func (b *sseBody) firstWritten() {
	b.first = false
	b.r.R.P.M.TTFT.WithLabelValues(b.r.R.Mode).Observe(time.Since(b.r.R.Start).Seconds())
	if b.cc != nil && b.leg.Conn().SetReadDeadline(time.Now().Add(loopAfter)) != nil {
		b.cc = nil
	}
}

// Read implements io.Reader for fasthttp's chunked body writer.
func (b *sseBody) Read(p []byte) (int, error) {
	if b.off >= len(b.out) {
		if b.ended {
			return 0, io.EOF
		}
		if err := b.fill(); err != nil {
			return 0, err
		}
		if b.off >= len(b.out) {
			return 0, io.EOF
		}
	}
	n := copy(p, b.out[b.off:])
	b.off += n
	if b.first {
		b.firstWritten()
	}
	return n, nil
}

// WriteTo implements io.WriterTo; with SupportsBodyWriteTo it lets
// fasthttp frame each chunk straight from this body's buffer (one flushed
// chunk per Write) instead of copying it through a 4 KiB buffer of its own
// that an open stream would hold for its whole life.
func (b *sseBody) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if b.off >= len(b.out) {
			if b.ended {
				return total, nil
			}
			if err := b.fill(); err != nil {
				return total, err
			}
			if b.off >= len(b.out) {
				return total, nil
			}
		}
		n, err := w.Write(b.out[b.off:])
		b.off += n
		total += int64(n)
		if n > 0 && b.first {
			b.firstWritten()
		}
		if err != nil {
			return total, err
		}
	}
}

// SupportsBodyWriteTo tells fasthttp that WriteTo may replace Read.
func (b *sseBody) SupportsBodyWriteTo() bool { return true }

// fill prepares the next chunk: the held events, or the next event and
// whatever complete events are already buffered behind it. It returns an
// error only when the client left (the answer cannot be ended cleanly).
// The chunk's buffer is taken from a pool once the first event is there and
// given back with the next fill, so a stream waiting on its engine holds
// none.
func (b *sseBody) fill() error {
	b.putOut()
	if b.held != nil {
		b.getOut()
		b.out = sse.Rewrite(b.out, b.held, b.fn)
		b.held = nil
		return nil
	}
	for {
		ev, err := b.er.Next()
		if err != nil && b.cc != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			// loopAfter has passed and the engine has nothing for now.
			if b.handOver() {
				return core.ErrHandedOver
			}
			b.cc = nil
			if err := b.leg.Conn().SetReadDeadline(time.Time{}); err == nil {
				continue
			}
		}
		if err != nil {
			if b.outp == nil {
				b.getOut()
			}
			return b.end(err)
		}
		if d := sse.FirstData(ev); d != nil && connectors.IsDone(d) {
			b.done = true
		}
		if b.outp == nil {
			b.getOut()
		}
		b.out = sse.Rewrite(b.out, ev, b.fn)
		if !b.er.Pending() || len(b.out) >= maxChunk {
			return nil
		}
	}
}

func (b *sseBody) getOut() {
	b.outp, b.out = b.r.R.P.Bufs.GetChunk()
	b.off = 0
}

func (b *sseBody) putOut() {
	if b.outp != nil {
		b.r.R.P.Bufs.PutChunk(b.outp, b.out)
	}
	b.outp, b.out, b.off = nil, nil, 0
}

// end handles the upstream's end: a complete stream, a client that left, or
// a stream that broke off (ended for the client with an error event).
func (b *sseBody) end(err error) error {
	r := b.r
	b.ended = true
	if err != nil && !errors.Is(err, io.EOF) {
		// A broken or refused stream: its connection is closed now, not
		// once the client took the stream's end.
		b.leg.Close()
	}
	switch {
	case r.R.Gone():
		Left(r.R)
		return core.ErrClientGone
	case errors.Is(err, io.EOF):
		err = nil
	}
	b.out = endStream(r.R, b.out, b.done, err)
	return nil
}

// endStream records how an upstream stream ended (err nil: its body ended
// cleanly; done: [DONE] was seen) and appends to out what the client's
// stream still needs: nothing when it is complete, else an error event.
func endStream(r *core.Request, out []byte, done bool, err error) []byte {
	if err == nil && (done || !needsDone(r.API)) {
		r.LogAt(zerolog.InfoLevel).Str("mode", r.Mode).Msg("stream complete")
		return out
	}
	if err == nil {
		err = errors.New("stream ended without [DONE]")
	}
	r.LogAt(zerolog.ErrorLevel).Err(err).Msg("upstream stream broke off; ending the client stream with an error event")
	cause := fmt.Errorf("%w: stream broke off", core.ErrDecodeFailed)
	if errors.Is(err, sse.ErrEventTooLong) {
		cause = fmt.Errorf("%w: %w", core.ErrDecodeFailed, sse.ErrEventTooLong)
	}
	return append(out, sse.ErrorEvent(core.FailureBody(cause))...)
}

// Close implements io.Closer: fasthttp calls it when the body is written or
// the client write failed.
func (b *sseBody) Close() error {
	if b.handedOver {
		b.putOut()
		return nil
	}
	if !b.ended || b.off < len(b.out) {
		b.r.R.Cancel(core.ErrClientGone)
		Left(b.r.R)
	}
	b.putOut()
	if b.pipelined {
		// The watch took the first byte of the client's next request: the
		// connection cannot serve it; the client sends it again.
		_ = b.r.RC.Conn().Close()
	}
	if b.release != nil {
		b.release()
		b.release = nil
	}
	return nil
}

var (
	_ io.ReadCloser         = (*sseBody)(nil)
	_ fasthttp.BodyWriterTo = (*sseBody)(nil)
)
