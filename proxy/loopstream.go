package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/netloop"
)

// maxEvent bounds one SSE event carried by an event loop (an event that
// long is no engine's; the stream is ended with an error event).
const maxEvent = 4 << 20

// errEventTooLong: an upstream SSE event exceeded maxEvent.
var errEventTooLong = errors.New("SSE event longer than 4 MiB")

// loopStream carries a streamed answer on an event loop (netloop) from its
// first write to its end. The upstream connection's readiness wakes the
// loop, which reads what came into the loop's buffer, cuts it into events
// (rewritten as on the goroutine path, sseBody) and writes them to the
// client as one chunk. An open stream so holds no goroutine, no stack and
// no buffer: only this struct, an event not yet whole, or a chunk the
// client has not taken yet. At its end the client connection goes back to
// the fasthttp server for its next request.
//
// A stream goes to a loop only once its answer has begun (a stream whose
// whole answer is already here stays on the goroutine path, which costs
// less), only between plain TCP connections, and only for an HTTP/1.1
// client; the rest streams on its goroutine.
type loopStream struct {
	mu   sync.Mutex // Ready, start: one at a time
	r    *request
	loop *netloop.Loop
	srv  *fasthttp.Server
	leg  *Leg
	body httpbody.Decoder
	fn   func([]byte) []byte // per-payload rewrite (nil: none)

	ufd, cfd  int
	raw       net.Conn // the client connection
	hj        net.Conn // raw as fasthttp hijacked it (with what it read ahead)
	keepAlive bool
	first     []byte // head and first chunk, written by start
	firstp    *[]byte

	done     bool   // [DONE] seen
	partial  []byte // the start of an event not yet whole
	pending  []byte // bytes the client has not taken yet
	ended    bool   // the upstream is done: pending holds the last bytes
	finished bool
	release  func() // frees the request's leg bookkeeping, once
}

// toLoop hands the answer to an event loop and reports whether it did; it
// is called with the head copied to the client response, the held
// preamble, and er with whatever it read. When it returns true the request
// is the loop's, and the handler returns.
func (r *request) toLoop(leg *Leg, er *eventReader, held []byte, remote bool, release func()) bool {
	p := r.p
	srv := p.servers[r.local]
	if p.loops == nil || srv == nil || !r.rc.Request.Header.IsHTTP11() {
		return false
	}
	cfd, ok1 := netloop.FD(r.rc.Conn())
	ufd, ok2 := netloop.FD(leg.conn)
	if !ok1 || !ok2 {
		return false
	}
	// An answer that is all here already is written faster by the
	// goroutine path than handed over.
	if d := leg.body; bodyComplete(&d, leg.ahead()) {
		return false
	}
	if r.watch.stop() || !leg.disarm() {
		return false // a pipelined request (close after), or a leg being cancelled
	}
	ls := &loopStream{r: r, loop: p.loops.Pick(), srv: srv, leg: leg, body: leg.body,
		ufd: ufd, cfd: cfd, raw: r.rc.Conn(), release: release, done: bytes.Contains(held, doneEvent)}
	if remote && p.rewriter != nil {
		h := *r.handoff
		ls.fn = func(d []byte) []byte { return p.rewriter.RewriteAnswer(r.api, d, h) }
	}
	ls.keepAlive = !r.rc.Request.Header.ConnectionClose()
	h := &r.rc.Response.Header
	h.SetContentLength(-1)
	if !ls.keepAlive {
		h.SetConnectionClose()
	}
	if len(h.Server()) == 0 {
		h.SetServer(serverName)
	}
	var out []byte
	ls.firstp, out = p.bufs.getChunk()
	out = append(out, h.Header()...)
	out, mark := httpbody.BeginChunk(out)
	out = rewriteEvent(out, held, ls.fn)
	var err error
	if b, _ := er.br.Peek(er.br.Buffered()); len(b) > 0 {
		out, err = ls.feed(out, b)
	}
	er.release()
	if err == nil {
		out, err = ls.feedRaw(out, leg.ahead())
	}
	leg.dropReader()
	if err != nil {
		// Unframeable before the first write: end the stream at once.
		out, mark = ls.endUpstream(out, mark, err)
	} else if ls.body.Done() {
		out, mark = ls.endUpstream(out, mark, nil)
	}
	out = httpbody.EndChunk(out, mark)
	if ls.ended {
		out = append(out, httpbody.LastChunk...)
	}
	ls.first = out
	r.detached = true
	p.loopStreams.Add(1)
	p.m.LoopStreams.Inc()
	r.rc.HijackSetNoResponse(true)
	r.rc.Hijack(ls.start)
	return true
}

// bodyComplete reports whether raw holds the whole rest of the body that d
// decodes (d is a copy: it is advanced).
func bodyComplete(d *httpbody.Decoder, raw []byte) bool {
	for len(raw) > 0 && !d.Done() {
		_, n, err := d.Next(raw, len(raw))
		if err != nil || n == 0 {
			return false
		}
		raw = raw[n:]
	}
	return d.Done()
}

// loopAfter is how long a stream is relayed by its own goroutine before
// it goes to the event loop. A stream that ends sooner (a short answer, a
// fast engine) never pays for the hand-over; a long one (an LLM stream
// lasts seconds) spends nearly all its life on the loop.
const loopAfter = 5 * time.Millisecond

// start runs once fasthttp let go of the client connection, on a goroutine
// of its own: it writes the head and the first chunk, relays the stream
// for up to loopAfter, then hands what is left to the loop.
func (ls *loopStream) start(hj net.Conn) {
	ls.hj = hj
	_, err := ls.raw.Write(ls.first)
	ls.r.p.m.TTFT.WithLabelValues(ls.r.mode).Observe(time.Since(ls.r.start).Seconds())
	ls.r.p.bufs.putChunk(ls.firstp, ls.first)
	ls.first, ls.firstp = nil, nil
	switch {
	case err != nil:
		ls.abort(ErrClientGone)
		return
	case ls.ended:
		ls.complete(true)
		return
	}
	if !ls.relay() {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if err := ls.loop.Add(ls.cfd, 0, ls); err != nil {
		ls.fail(err)
		return
	}
	if err := ls.loop.Add(ls.ufd, netloop.Readable, ls); err != nil {
		ls.fail(err)
	}
}

// relay streams on the calling goroutine, with blocking reads and writes,
// until the stream ends (false) or loopAfter has passed (true: to the
// loop).
func (ls *loopStream) relay() bool {
	conn := ls.leg.conn
	if conn.SetReadDeadline(time.Now().Add(loopAfter)) != nil {
		return true
	}
	inp, in := ls.r.p.bufs.getChunk()
	outp, out := ls.r.p.bufs.getChunk()
	in = in[:cap(in)]
	defer func() {
		ls.r.p.bufs.putChunk(inp, in[:0])
		ls.r.p.bufs.putChunk(outp, out[:0])
	}()
	for {
		n, err := conn.Read(in)
		if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			return conn.SetReadDeadline(time.Time{}) == nil || ls.failed(err)
		}
		eof := errors.Is(err, io.EOF)
		if eof {
			err = nil
		}
		out = ls.relayed(out[:0], in[:n], eof, err)
		if _, err := ls.raw.Write(out); err != nil {
			ls.abort(ErrClientGone)
			return false
		}
		if ls.ended {
			ls.complete(true)
			return false
		}
	}
}

// failed ends the stream with err and returns false.
func (ls *loopStream) failed(err error) bool {
	ls.fail(err)
	return false
}

// takeBack returns the connection to serve again after the stream: raw,
// unless fasthttp had read bytes past the request (a pipelined next one)
// into the buffer behind hj, its hijacked connection; then raw behind
// those bytes. Serving hj itself would nest one more reader per stream on
// a keep-alive connection.
func takeBack(hj, raw net.Conn, bufs *streamBufs) net.Conn {
	if hj == raw || raw.SetReadDeadline(time.Unix(1, 0)) != nil {
		return hj
	}
	var ahead []byte
	bufp, buf := bufs.getChunk()
	defer bufs.putChunk(bufp, buf)
	buf = buf[:cap(buf)]
	for {
		// With the deadline past, only bytes buffered above raw come back.
		n, err := hj.Read(buf)
		ahead = append(ahead, buf[:n]...)
		if err != nil || n == 0 {
			break
		}
	}
	if raw.SetReadDeadline(time.Time{}) != nil {
		return hj
	}
	if len(ahead) == 0 {
		return raw
	}
	return &prefixedConn{Conn: raw, r: io.MultiReader(bytes.NewReader(ahead), raw)}
}

// prefixedConn is a connection with bytes already read from it put back.
type prefixedConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Ready implements netloop.Handler.
func (ls *loopStream) Ready(fd int, ev netloop.Events) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	switch {
	case ls.finished:
	case ev&netloop.Shutdown != 0:
		ls.fail(ErrDrainTimeout)
	case fd == ls.cfd && ev&netloop.Writable != 0:
		ls.flush()
	case fd == ls.cfd: // hung up
		ls.abort(ErrClientGone)
	case fd == ls.ufd:
		ls.readUpstream()
	}
}

// readUpstream relays what the upstream sent, on the loop.
func (ls *loopStream) readUpstream() {
	in, out := ls.loop.Buffers()
	n, err := netloop.Read(ls.ufd, in)
	if errors.Is(err, netloop.ErrWouldBlock) {
		return
	}
	ls.write(ls.relayed(out, in[:n], n == 0 && err == nil, err))
}

// relayed appends to out the client's next bytes from what one read of
// the upstream gave: in (the bytes read), eof (the connection closed) or
// rerr (the read failed). They end the stream when the upstream's answer
// ended (ls.ended is then set).
func (ls *loopStream) relayed(out, in []byte, eof bool, rerr error) []byte {
	out, mark := httpbody.BeginChunk(out)
	var ferr error
	if len(in) > 0 {
		out, ferr = ls.feedRaw(out, in)
	}
	switch {
	case ferr != nil:
		out, mark = ls.endUpstream(out, mark, ferr)
	case ls.body.Done():
		out, mark = ls.endUpstream(out, mark, nil)
	case rerr != nil:
		out, mark = ls.endUpstream(out, mark, fmt.Errorf("read %s: %w", ls.r.local, rerr))
	case eof && ls.body.Mode() == httpbody.UntilClose:
		out, mark = ls.endUpstream(out, mark, nil)
	case eof:
		out, mark = ls.endUpstream(out, mark, fmt.Errorf("read %s: connection closed mid-body", ls.r.local))
	}
	out = httpbody.EndChunk(out, mark)
	if ls.ended {
		out = append(out, httpbody.LastChunk...)
	}
	return out
}

// feedRaw decodes raw body bytes (framing included) and appends their
// events to out.
func (ls *loopStream) feedRaw(out, raw []byte) ([]byte, error) {
	for len(raw) > 0 && !ls.body.Done() {
		data, n, err := ls.body.Next(raw, len(raw))
		if err != nil {
			return out, err
		}
		raw = raw[n:]
		if out, err = ls.feed(out, data); err != nil {
			return out, err
		}
	}
	return out, nil
}

// feed cuts body bytes into events (as eventReader does: each up to its
// blank line, stray blank lines dropped) and appends them to out, keeping
// an incomplete last event for the next call.
func (ls *loopStream) feed(out, data []byte) ([]byte, error) {
	if len(data) == 0 {
		return out, nil
	}
	if len(ls.partial) > 0 {
		ls.partial = append(ls.partial, data...)
		data = ls.partial
	}
	start, pos := 0, 0
	for {
		i := bytes.IndexByte(data[pos:], '\n')
		if i < 0 {
			break
		}
		end := pos + i + 1
		if isBlank(data[pos:end]) {
			if len(bytes.TrimSpace(data[start:pos])) > 0 {
				out = ls.emit(out, data[start:end])
			}
			start = end
		}
		pos = end
	}
	rest := data[start:]
	switch {
	case len(rest) > maxEvent:
		return out, errEventTooLong
	case len(rest) == 0:
		ls.partial = nil
	case len(ls.partial) > 0:
		ls.partial = ls.partial[:copy(ls.partial, rest)]
	default:
		ls.partial = append([]byte(nil), rest...)
	}
	return out, nil
}

func (ls *loopStream) emit(out, ev []byte) []byte {
	if d := firstData(ev); d != nil && connectors.IsDone(d) {
		ls.done = true
	}
	return rewriteEvent(out, ev, ls.fn)
}

// endUpstream ends the upstream leg (err nil: its body ended cleanly) and
// appends the stream's last events to the open chunk: a final event that
// lacked its blank line, and an error event when the stream broke off.
func (ls *loopStream) endUpstream(out []byte, mark int, err error) ([]byte, int) {
	r := ls.r
	if err == nil && len(bytes.TrimSpace(ls.partial)) > 0 {
		out = ls.emit(out, append(ls.partial, "\n\n"...))
	}
	ls.partial = nil
	if err == nil && (ls.done || !needsDone(r.api)) {
		r.logAt(zerolog.InfoLevel).Str("mode", r.mode).Msg("stream complete")
	} else {
		if err == nil {
			err = errors.New("stream ended without [DONE]")
		}
		r.logAt(zerolog.ErrorLevel).Err(err).Msg("upstream stream broke off; ending the client stream with an error event")
		out = append(out, sseError(fasthttp.StatusBadGateway, fmt.Errorf("%w: stream broke off", ErrDecodeFailed))...)
	}
	ls.ended = true
	ls.closeLeg(err == nil)
	return out, mark
}

// closeLeg stops watching the upstream and closes the leg: its connection
// goes back to the pool when clean.
func (ls *loopStream) closeLeg(clean bool) {
	if ls.leg == nil {
		return
	}
	_ = ls.loop.Remove(ls.ufd)
	ls.leg.eof = clean && ls.body.Done()
	ls.leg.Close()
	ls.leg = nil
}

// write sends b to the client; what does not fit waits for the client to
// take it, with the upstream paused meanwhile.
func (ls *loopStream) write(b []byte) {
	if len(b) == 0 {
		return
	}
	n, err := netloop.Write(ls.cfd, b)
	switch {
	case err == nil:
		if ls.ended {
			ls.complete(false)
		}
	case errors.Is(err, netloop.ErrWouldBlock):
		ls.pending = append(ls.pending[:0], b[n:]...)
		if !ls.ended {
			if err := ls.loop.Modify(ls.ufd, 0); err != nil {
				ls.fail(err)
				return
			}
		}
		if err := ls.loop.Modify(ls.cfd, netloop.Writable); err != nil {
			ls.fail(err)
		}
	default:
		ls.abort(ErrClientGone)
	}
}

// flush sends pending bytes once the client can take them.
func (ls *loopStream) flush() {
	n, err := netloop.Write(ls.cfd, ls.pending)
	switch {
	case err == nil:
		ls.pending = nil
		if ls.ended {
			ls.complete(false)
			return
		}
		if err := ls.loop.Modify(ls.cfd, 0); err != nil {
			ls.fail(err)
			return
		}
		if err := ls.loop.Modify(ls.ufd, netloop.Readable); err != nil {
			ls.fail(err)
		}
	case errors.Is(err, netloop.ErrWouldBlock):
		ls.pending = ls.pending[:copy(ls.pending, ls.pending[n:])]
	default:
		ls.abort(ErrClientGone)
	}
}

// complete ends a stream written whole: the client connection goes back
// to the server for its next request, served on this goroutine when it
// has nothing else to do (inline), else on a new one.
func (ls *loopStream) complete(inline bool) {
	_ = ls.loop.Remove(ls.cfd)
	ls.finish()
	if !ls.keepAlive || ls.r.p.draining.Load() {
		_ = ls.raw.Close()
		return
	}
	c := takeBack(ls.hj, ls.raw, &ls.r.p.bufs)
	if inline {
		_ = ls.srv.ServeConn(c)
		return
	}
	go func() { _ = ls.srv.ServeConn(c) }()
}

// abort ends a stream whose client left: the upstream leg is cancelled.
func (ls *loopStream) abort(cause error) {
	r := ls.r
	r.cancel(cause)
	r.left()
	ls.teardown()
}

// fail ends a stream the loop cannot carry on (a watch that failed, or
// the loop shutting down): both connections are closed.
func (ls *loopStream) fail(err error) {
	ls.r.logAt(zerolog.ErrorLevel).Err(err).Msg("stream ended by the sidecar; connections closed")
	ls.r.cancel(err)
	ls.teardown()
}

func (ls *loopStream) teardown() {
	_ = ls.loop.Remove(ls.cfd)
	ls.closeLeg(false)
	ls.finish()
	_ = ls.raw.Close()
}

// finish ends the request's bookkeeping, once.
func (ls *loopStream) finish() {
	if ls.finished {
		return
	}
	ls.finished = true
	ls.closeLeg(false)
	ls.pending, ls.partial = nil, nil
	ls.release()
	ls.r.p.loopStreams.Add(-1)
	ls.r.p.m.LoopStreams.Dec()
}

var _ netloop.Handler = (*loopStream)(nil)
