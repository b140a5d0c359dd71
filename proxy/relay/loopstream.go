package relay

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/netloop"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/sserelay"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// LoopStream carries a streamed answer on an event loop (netloop). The
// answer begins as every answer does, written by fasthttp's server
// goroutine from an sseBody; once it has streamed for loopAfter and would
// wait on its engine, the sseBody hands it over: fasthttp lets go of the
// connection (clientconn.Conn), and from then on the upstream connection's
// readiness wakes the loop, which reads what came into the loop's buffer,
// cuts it into events (rewritten as sseBody does) and writes them to the
// client as one chunk. An open stream so holds no goroutine, no stack and
// no buffer: only this struct, an event not yet whole, or a chunk the
// client has not taken yet. At its end the client connection goes back to
// the fasthttp server for its next request.
//
// Only streams between plain TCP connections, from an HTTP/1.1 client
// with nothing read ahead (no pipelined request), are handed over; the
// rest stream on their goroutine to the end.
type LoopStream struct {
	mu   sync.Mutex // Ready and begin: one at a time
	R    *core.Request
	Loop *netloop.Loop
	// The answer's body, cut into events and rewritten (Body: its
	// decoder; Rewrite: the per-payload rewrite; MaxEvent:
	// --max-sse-event-bytes), and its gate.
	sserelay.Stream

	UFD, CFD  int
	KeepAlive bool
	first     []byte // the first chunk, written by begin
	firstp    *[]byte

	Cut      error  // sse.ErrEventTooLong, once the stream was refused for it
	UpErr    error  // why the upstream's answer broke off (nil: it ended cleanly, or has not ended)
	pending  []byte // bytes the client has not taken yet
	Ended    bool   // the upstream is done: pending holds the last bytes
	Finished bool
	Release  func() // frees the leg and finishes the request, once

	Conns   StreamConns // the two connections
	UpEnded bool        // conns.LegEnd was called

	// A lane stream is held back, as relaySSE holds it, while its gate
	// (sserelay.Stream.Gate) is shut; held is what came meanwhile (head
	// included), up to maxHeld. gated decides what becomes of the held
	// bytes once the gate opened, or the stream ended while it was shut.
	held  []byte
	Gated func(g sserelay.Gate, held []byte)
}

// StreamConns is what a loopStream does with its two connections, which
// a stream handed over by fasthttp (legConns) and one the lane served from
// its start (laneConn) keep differently. Called on the loop's goroutine,
// with the stream's lock held.
type StreamConns interface {
	LegEnd(clean bool)                   // ends the upstream leg, its body read whole when clean (the connection is then pooled); once
	LegPause() error                     // stops watching the upstream while the client catches up
	LegResume() error                    // watches it again
	ClientWatch(ev netloop.Events) error // sets the events the client connection is watched for
	ClientDone(keep bool)                // the answer is over: the connection goes on to its next request (keep), or is closed
	FirstOutput()                        // the first event is being relayed
}

// loopAfter is how long a stream is relayed by its server goroutine, from
// its first write, before it may go to an event loop. A stream that ends
// sooner (a short answer, a fast engine) never pays for the hand-over; a
// long one (an LLM stream lasts seconds, at 10-50 ms per token) spends
// nearly all its life on the loop.
const loopAfter = 50 * time.Millisecond

// loopable reports whether b's stream may be handed to a loop later.
func (b *sseBody) loopable() bool {
	r := b.r
	if r.P.Loops == nil || r.P.Servers[r.R.Home] == nil || !r.RC.Request.Header.IsHTTP11() {
		return false
	}
	cc, ok := r.RC.Conn().(*clientconn.Conn)
	if _, plain := b.leg.Conn().(*net.TCPConn); !ok || !plain {
		return false // TLS on either side, or no socket to watch
	}
	b.cc = cc
	b.keepAlive = !r.RC.Request.Header.ConnectionClose() && !r.RC.Response.ConnectionClose()
	return true
}

// handOver prepares the hand-over of b's stream, which has nothing to
// read from its engine right now: the events already read (b.out from
// b.off, the event reader's buffer, the upstream's unread bytes) become
// the loop's first chunk. It reports false when the stream must stay
// (fasthttp read ahead: a pipelined request; or the leg is being
// cancelled). Then the handler calls clientconn.Conn.Close: see begin.
func (b *sseBody) handOver() bool {
	r, leg := b.r, b.leg
	cc := b.cc
	cfd, ok1 := netloop.FD(cc.TCPConn)
	ufd, ok2 := netloop.FD(leg.Conn())
	if !ok1 || !ok2 || !cc.Synced() || !leg.Disarm() {
		return false
	}
	loop := r.P.Loops.Pick()
	release := b.release
	ls := &LoopStream{R: r.R, Loop: loop, KeepAlive: b.keepAlive, CFD: cfd, UFD: ufd,
		Stream: sserelay.Stream{Body: leg.Body(), Rewrite: b.fn, API: r.R.API, MaxEvent: r.R.P.Cfg.MaxSSEEventBytes}}
	if b.done {
		ls.MarkDone()
	}
	ls.Release = func() {
		release()
		r.P.LoopRequests.Add(-1)
		r.R.P.M.LoopStreams.Dec()
	}
	ls.Conns = &LegConns{ls: ls, leg: leg, done: func(keep bool) { r.P.ConnDone(cc, r.R.Home, keep) }}
	var out []byte
	ls.firstp, out = r.R.P.Bufs.GetChunk()
	out, mark := httpbody.BeginChunk(out)
	out = append(out, b.out[b.off:]...)
	var err error
	for _, ev := range b.er.Unread() {
		if err == nil {
			out, err = ls.Feed(out, ev)
		}
	}
	b.er.Release()
	if err == nil {
		out, err = ls.FeedRaw(out, leg.Ahead())
	}
	leg.DropReader()
	ls.noteFirstOutput()
	if err != nil {
		out = ls.endUpstream(out, err)
	} else if ls.Body.Done() {
		out = ls.endUpstream(out, nil)
	}
	out = httpbody.EndChunk(out, mark)
	if ls.Ended {
		out = append(out, httpbody.LastChunk...)
	}
	ls.first = out
	b.release = nil // the loop's now
	b.handedOver = true
	cc.HandOff(ls.begin)
	// Counted before fasthttp lets go of the connection, so that a drain
	// never sees the stream in neither the server's count nor the loops'.
	r.P.LoopRequests.Add(1)
	r.R.P.M.LoopStreams.Inc()
	r.R.P.M.LoopHandoffs.Inc()
	return true
}

// LegConns are the connections of a stream handed over by fasthttp, whose
// handler ls is for both: leg is the upstream, and done takes the client
// connection once the answer is over.
type LegConns struct {
	ls   *LoopStream
	leg  *upstream.Leg
	done func(keep bool)
}

func (c *LegConns) LegEnd(clean bool) {
	_ = c.ls.Loop.Remove(c.ls.UFD)
	c.leg.MarkEnded(clean)
	c.leg.Close()
}
func (c *LegConns) LegPause() error  { return c.ls.Loop.Remove(c.ls.UFD) }
func (c *LegConns) LegResume() error { return c.ls.Loop.Add(c.ls.UFD, netloop.Readable, c.ls) }
func (c *LegConns) ClientWatch(ev netloop.Events) error {
	return c.ls.Loop.Modify(c.ls.CFD, ev)
}
func (c *LegConns) ClientDone(keep bool) {
	_ = c.ls.Loop.Remove(c.ls.CFD)
	c.done(keep)
}
func (c *LegConns) FirstOutput() {} // the answer's first write recorded the TTFT

// begin runs on fasthttp's server goroutine when it lets go of the
// connection (clientconn.Conn.Close): it watches both connections on the loop
// and writes the first chunk.
func (ls *LoopStream) begin() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	r := ls.R
	first := ls.first
	defer r.P.Bufs.PutChunk(ls.firstp, first)
	ls.first, ls.firstp = nil, nil
	if ls.Ended {
		ls.Write(first)
		return
	}
	if err := ls.Loop.Add(ls.CFD, 0, ls); err != nil {
		ls.Fail(err)
		return
	}
	if err := ls.Loop.Add(ls.UFD, netloop.Readable, ls); err != nil {
		ls.Fail(err)
		return
	}
	ls.Write(first)
}

// Ready implements netloop.Handler.
func (ls *LoopStream) Ready(fd int, ev netloop.Events) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.Handle(fd, ev)
}

// Handle reacts to an event of either connection.
func (ls *LoopStream) Handle(fd int, ev netloop.Events) {
	switch {
	case ls.Finished:
	case ev&netloop.Shutdown != 0:
		ls.Fail(core.ErrDrainTimeout)
	case fd == ls.CFD && ev&netloop.Writable != 0:
		ls.flush()
	case fd == ls.CFD: // hung up
		ls.abort(core.ErrClientGone)
	case fd == ls.UFD && len(ls.pending) == 0:
		ls.readUpstream()
	}
}

// readUpstream relays what the upstream sent, on the loop.
func (ls *LoopStream) readUpstream() {
	in, out := ls.Loop.Buffers()
	n, err := netloop.Read(ls.UFD, in)
	if errors.Is(err, netloop.ErrWouldBlock) {
		return
	}
	ls.Deliver(ls.Relayed(out, in[:n], n == 0 && err == nil, err))
}

// Deliver writes out to the client, or holds it while the gate is shut.
func (ls *LoopStream) Deliver(out []byte) {
	if ls.Gate == sserelay.GateOff {
		ls.Write(out)
		return
	}
	held := out // the loop's buffer: copied only when it must wait
	if len(ls.held) > 0 {
		ls.held = append(ls.held, out...)
		held = ls.held
	}
	if ls.Gate.Shut() && len(held) < core.MaxHeld && !ls.Ended {
		if len(ls.held) == 0 {
			ls.held = append([]byte(nil), out...)
		}
		return
	}
	g := ls.Gate
	if g.Shut() && !ls.Ended {
		g = sserelay.GateOutput // preamble enough: relayed as relaySSE does
	}
	ls.Gate, ls.held = sserelay.GateOff, nil
	ls.Gated(g, held)
}

// Relayed appends to out the client's next bytes from what one read of
// the upstream gave: in (the bytes read), eof (the connection closed) or
// rerr (the read failed). They end the stream when the upstream's answer
// ended (ls.ended is then set).
func (ls *LoopStream) Relayed(out, in []byte, eof bool, rerr error) []byte {
	out, mark := httpbody.BeginChunk(out)
	var ferr error
	if len(in) > 0 {
		out, ferr = ls.FeedRaw(out, in)
		ls.noteFirstOutput()
	}
	switch {
	case ferr != nil:
		out = ls.endUpstream(out, ferr)
	case ls.Body.Done():
		out = ls.endUpstream(out, nil)
	case rerr != nil:
		out = ls.endUpstream(out, fmt.Errorf("read %s: %w", ls.R.Local, rerr))
	case eof && ls.Body.Mode() == httpbody.UntilClose:
		out = ls.endUpstream(out, nil)
	case eof:
		out = ls.endUpstream(out, fmt.Errorf("read %s: connection closed mid-body", ls.R.Local))
	}
	out = httpbody.EndChunk(out, mark)
	if ls.Ended {
		out = append(out, httpbody.LastChunk...)
	}
	return out
}

// noteFirstOutput tells the connections of the stream's first output,
// once an event of it went to the client.
func (ls *LoopStream) noteFirstOutput() {
	if ls.TakeFirstOutput() {
		ls.Conns.FirstOutput()
	}
}

// endUpstream ends the upstream leg (err nil: its body ended cleanly) and
// appends the stream's last events to out: a final event that lacked its
// blank line, and an error event when the stream broke off.
func (ls *LoopStream) endUpstream(out []byte, err error) []byte {
	if errors.Is(err, sse.ErrEventTooLong) && ls.Cut == nil {
		ls.Cut = err
		ls.R.EventRefused()
	}
	clean := err == nil
	ls.UpErr = err
	if clean {
		out = ls.FlushPartial(out)
		ls.noteFirstOutput()
	}
	ls.Discard()
	out = endStream(ls.R, out, ls.SawDone(), err)
	ls.Ended = true
	ls.CloseLeg(clean)
	return out
}

// EndedBefore is the error of a stream that ended before anything of it
// reached the client: what says so, and the bound that cut it, if one did.
func (ls *LoopStream) EndedBefore(what string) error {
	if ls.Cut != nil {
		return fmt.Errorf("%s: %w", what, ls.Cut)
	}
	return errors.New(what)
}

// CloseLeg stops watching the upstream and closes the leg: its connection
// goes back to the pool when clean.
func (ls *LoopStream) CloseLeg(clean bool) {
	if ls.UpEnded {
		return
	}
	ls.UpEnded = true
	ls.Conns.LegEnd(clean && ls.Body.Done() && !ls.Excess())
}

// Write sends b to the client; what does not fit waits for the client to
// take it, with the upstream paused meanwhile.
func (ls *LoopStream) Write(b []byte) {
	if len(b) == 0 {
		return
	}
	n, err := netloop.Write(ls.CFD, b)
	switch {
	case err == nil:
		if ls.Ended {
			ls.complete()
		}
	case errors.Is(err, netloop.ErrWouldBlock):
		// The client is slower than its engine: the upstream is not watched
		// until the client took what is pending (so nothing overtakes it, and
		// a hang-up of the engine meanwhile is seen when watching again).
		ls.pending = append(ls.pending[:0], b[n:]...)
		ls.R.LogAt(zerolog.DebugLevel).Int("pending", len(ls.pending)).Msg("client slower than its engine: upstream paused")
		if !ls.Ended {
			if err := ls.Conns.LegPause(); err != nil {
				ls.Fail(err)
				return
			}
		}
		if err := ls.Conns.ClientWatch(netloop.Writable); err != nil {
			ls.Fail(err)
		}
	default:
		ls.abort(core.ErrClientGone)
	}
}

// flush sends pending bytes once the client can take them.
func (ls *LoopStream) flush() {
	n, err := netloop.Write(ls.CFD, ls.pending)
	switch {
	case err == nil:
		ls.pending = nil
		if ls.Ended {
			ls.complete()
			return
		}
		if err := ls.Conns.ClientWatch(0); err != nil {
			ls.Fail(err)
			return
		}
		if err := ls.Conns.LegResume(); err != nil {
			ls.Fail(err)
		}
	case errors.Is(err, netloop.ErrWouldBlock):
		ls.pending = ls.pending[:copy(ls.pending, ls.pending[n:])]
	default:
		ls.abort(core.ErrClientGone)
	}
}

// complete ends a stream written whole: the client connection goes on to
// its next request.
func (ls *LoopStream) complete() {
	ls.Finish()
	ls.Conns.ClientDone(ls.KeepAlive && !ls.R.P.Draining.Load())
}

// abort ends a stream whose client left: the upstream leg is cancelled.
func (ls *LoopStream) abort(cause error) {
	r := ls.R
	r.Cancel(cause)
	Left(r)
	ls.teardown()
}

// Fail ends a stream the loop cannot carry on (a watch that failed, or
// the loop shutting down): both connections are closed.
func (ls *LoopStream) Fail(err error) {
	ls.R.LogAt(zerolog.ErrorLevel).Err(err).Msg("stream ended by the sidecar; connections closed")
	ls.R.Cancel(err)
	ls.teardown()
}

func (ls *LoopStream) teardown() {
	ls.CloseLeg(false)
	ls.Finish()
	ls.Conns.ClientDone(false)
}

// Finish ends the request's bookkeeping, once.
func (ls *LoopStream) Finish() {
	if ls.Finished {
		return
	}
	ls.Finished = true
	ls.CloseLeg(false)
	ls.pending = nil
	ls.Discard()
	ls.Release()
}

var _ netloop.Handler = (*LoopStream)(nil)
