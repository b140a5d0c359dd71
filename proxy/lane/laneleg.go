package lane

import (
	"errors"
	"io"
	"net"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/netloop"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// laneLeg is a connection's upstream leg: the request as sent upstream,
// kept for a retry until the answer's head arrives, the pooled or dialled
// engine connection it goes on (or the transport off the loop: offLoopLeg),
// pooled again or closed when the leg ends, and the answer's head and, when
// read whole, its body.
type laneLeg struct {
	lc        *laneConn
	addr      string // the current leg's upstream
	prefill   bool   // the current leg is the prefill
	up        *upConn
	dials     uint64 // dials begun, so that a late one is told from the current
	sent      []byte // the leg as sent upstream (its head, and its body when short), kept for a retry until the answer's head arrives
	sentp     *[]byte
	sentBody  []byte  // a long leg body, sent after sent from where it lies (legTo), kept as sent is
	sentBodyp *[]byte // the body pool's buffer holding sentBody, given back with sent (nil: none of its own)
	unsent    []byte  // what the upstream has not taken of sent yet
	unsentBdy []byte  // and of sentBody
	retried   bool
	head      []byte          // an answer head that came in more than one read
	interim   int             // interim 100 Continue answers skipped on the leg
	raw       *rawhttp.Answer // a non-streamed answer being read
	off       offLoopLeg      // the leg sent off the loop, while it runs (TLS to the prefiller)
}

// legTo ends the leg's head in lg.sent (its start is there) for addr, and
// sends it with body. A short body is appended to the head; a long one
// (past sse.MaxPooledChunk: a long prompt) is sent from where it lies, after
// the head in the same writev, and never copied: it is the request's
// body (held by reqBody, or the sanitized copy), or an edit of it built in
// bodyp, a buffer of the body pool the leg now holds until putSent.
func (lg *laneLeg) legTo(addr string, body []byte, bodyp *[]byte) {
	lc := lg.lc
	bufs := &lc.ll.ln.p.Bufs
	head := lc.r.Legs().AppendTo(lg.sent, lg.prefill)
	lg.sent = rawhttp.AppendLegEnd(head, addr, lc.r.ID, len(body))
	if len(body) > sse.MaxPooledChunk {
		lg.sentBody, lg.sentBodyp = body, bodyp
	} else {
		lg.sent = append(lg.sent, body...)
		bufs.PutScratch(bodyp)
	}
	lg.addr, lg.retried = addr, false
	lg.connect()
}

// connect sends lg.sent on a pooled connection to lg.addr, or on a new one.
func (lg *laneLeg) connect() {
	lc := lg.lc
	if offLoop(lc) {
		lg.off.send(lc) // TLS to the prefiller
		return
	}
	if u := lc.ll.pop(lg.addr); u != nil {
		lg.send(u)
		return
	}
	lg.dial()
}

// dial connects to lg.addr off the loop, then sends the leg on the loop.
func (lg *laneLeg) dial() {
	lc := lg.lc
	lc.state = laneSending
	lg.dials++
	ll, r, addr, n := lc.ll, lc.r, lg.addr, lg.dials
	go func() {
		conn, err := ll.ln.p.Tr.Dial(addr)
		var fd int
		if err == nil {
			var ok bool
			if fd, ok = netloop.FD(conn); !ok {
				_ = conn.Close()
				err = errors.New("not a plain TCP connection")
			}
		}
		if !ll.loop.Post(func() { lg.dialed(r, n, addr, conn, fd, err) }) && err == nil {
			_ = conn.Close()
		}
	}()
}

// dialed goes on from dial number n of request r, on the loop: the leg is
// sent on conn, or failed with err.
func (lg *laneLeg) dialed(r *core.Request, n uint64, addr string, conn net.Conn, fd int, err error) {
	lc := lg.lc
	ll := lc.ll
	mu := lc.lock()
	mu.Lock()
	defer mu.Unlock()
	if lc.state != laneSending || lc.r != r || lg.dials != n {
		if err == nil {
			_ = conn.Close()
		}
		return
	}
	if err != nil {
		lg.legFailed(&upstream.LegError{Addr: addr, Op: "dial", Err: err})
		return
	}
	u := &upConn{ll: ll, addr: addr, conn: conn, fd: fd, fresh: true}
	if err := ll.loop.Add(fd, netloop.Readable, u); err != nil {
		_ = conn.Close()
		lg.legFailed(&upstream.LegError{Addr: addr, Op: "dial", Err: err})
		return
	}
	u.watched = true
	lg.send(u)
}

// send writes the request to u and waits for the answer.
func (lg *laneLeg) send(u *upConn) {
	lc := lg.lc
	ll := lc.ll
	ll.mu.Lock()
	u.owner = lc
	ll.mu.Unlock()
	u.keep = true
	lg.up, lc.state, lg.head, lg.unsent, lg.unsentBdy, lg.interim = u, laneWaiting, lg.head[:0], lg.sent, lg.sentBody, 0
	lg.writeUp()
}

// writeUp writes what the engine has not taken of the request yet; when
// its socket is full, the rest waits for it to be writable.
func (lg *laneLeg) writeUp() {
	lc := lg.lc
	u := lg.up
	na, nb, err := netloop.Write2(u.fd, lg.unsent, lg.unsentBdy)
	lg.unsent, lg.unsentBdy = lg.unsent[na:], lg.unsentBdy[nb:]
	switch {
	case err == nil && u.writing:
		u.writing = false
		err = lc.ll.loop.Modify(u.fd, netloop.Readable)
	case errors.Is(err, netloop.ErrWouldBlock) && !u.writing:
		u.writing = true
		err = lc.ll.loop.Modify(u.fd, netloop.Readable|netloop.Writable)
	case errors.Is(err, netloop.ErrWouldBlock):
		err = nil
	}
	if err != nil {
		lg.upFailed(&upstream.LegError{Addr: lg.addr, Op: "write", Err: err})
	}
}

// upReady handles an event of the engine connection.
func (lg *laneLeg) upReady(u *upConn, ev netloop.Events) {
	lc := lg.lc
	mu := lc.lock()
	mu.Lock()
	defer mu.Unlock()
	if lg.up != u {
		return
	}
	switch lc.state {
	case laneWaiting:
		if len(lg.unsent)+len(lg.unsentBdy) > 0 && ev&netloop.Writable != 0 {
			lg.writeUp()
			return
		}
		lg.readHead()
	case laneAnswer:
		if lc.reply.ls != nil {
			lc.reply.ls.Handle(u.fd, ev)
		} else if lg.raw != nil {
			lg.readRaw()
		}
	}
}

// readHead reads the answer's head (and what came with it of the body).
func (lg *laneLeg) readHead() {
	lc := lg.lc
	ll := lc.ll
	in, _ := ll.loop.Buffers()
	n, err := netloop.Read(lg.up.fd, in)
	switch {
	case errors.Is(err, netloop.ErrWouldBlock):
		return
	case err != nil:
		lg.upFailed(&upstream.LegError{Addr: lg.addr, Op: "read", Err: err})
		return
	case n == 0:
		lg.upFailed(&upstream.LegError{Addr: lg.addr, Op: "read", Err: upstream.ErrUpClosed})
		return
	}
	b := in[:n]
	if len(lg.head) > 0 {
		lg.head = append(lg.head, b...)
		b = lg.head
	}
	rest, whole, err := rawhttp.ParseAnswerHead(&ll.resp, &ll.rd, ll.br, b, ll.ln.p.Cfg.Guard.MaxHeaderBytes, &lg.interim)
	switch {
	case err != nil:
		lg.upFailed(&upstream.LegError{Addr: lg.addr, Op: "read", Err: err})
		return
	case !whole:
		// Interim answers skipped are dropped; the rest waits for more.
		lg.head = append(lg.head[:0], rest...)
		return
	}
	b = rest
	if c := lc.chunk; c != nil && c.leg {
		c.head(b)
		return
	}
	if lg.prefill {
		lg.prefillHead(b)
		return
	}
	lc.reply.answer(b)
}

// readWhole reads an answer whole (head in ll.resp, its body decoded by
// dec from rest on) before anything of it is written.
func (lg *laneLeg) readWhole(dec httpbody.Decoder, rest []byte) {
	lc := lg.lc
	p := lc.ll.ln.p
	lg.raw = &rawhttp.Answer{Body: dec, Status: lc.ll.resp.StatusCode(), Max: p.Cfg.MaxUpstreamAnswerBytes,
		Hold: upstream.NewAnswerHold(p.Guard.Budget())}
	if err := lg.raw.Begin(&lc.ll.resp); err != nil {
		lg.rawBroke(err)
		return
	}
	lc.ll.resp.CopyTo(&lg.raw.Head)
	lg.feedRaw(rest)
}

func (lg *laneLeg) readRaw() {
	lc := lg.lc
	in, _ := lc.ll.loop.Buffers()
	n, err := netloop.Read(lg.up.fd, in)
	switch {
	case errors.Is(err, netloop.ErrWouldBlock):
		return
	case err != nil:
		lg.rawBroke(err)
		return
	case n == 0 && lg.raw.Body.Mode() == httpbody.UntilClose:
		lg.rawDone()
		return
	case n == 0:
		lg.rawBroke(io.ErrUnexpectedEOF)
		return
	}
	lg.feedRaw(in[:n])
}

// feedRaw decodes body bytes of a non-streamed answer; the answer is
// written once whole.
func (lg *laneLeg) feedRaw(b []byte) {
	a := lg.raw
	if err := a.Feed(b); err != nil {
		lg.rawBroke(err)
		return
	}
	if a.Body.Done() {
		lg.rawDone()
	}
}

// rawDone ends an answer read whole: the prefill's is the split's next
// step; a decode leg's is written.
func (lg *laneLeg) rawDone() {
	lc := lg.lc
	r, a := lc.r, lg.raw
	lg.raw = nil
	// What is kept of a.Buf past here is a copy (written out, or the next
	// leg's body).
	defer a.Hold.Release()
	lg.endUp(a.Body.Done() && !a.Excess)
	switch {
	case lc.shadowOf != nil:
		lc.shadowOf.split.shadowWhole(lc, a)
	case lc.chunk != nil && lc.chunk.leg:
		lc.chunk.answered(a)
	case lg.prefill:
		lc.split.PrefillAnswered(a)
	case lc.split.decodeFirst() != nil:
		lc.split.decodeFirst().answered(a)
	case r.Handoff != nil:
		lc.split.remoteAnswered(a)
	default:
		r.JSONAnswered(a.Status)
		lc.reply.writeWhole(&a.Head, r.LocalAnswerBody(a.Status, a.Buf))
	}
}

// rawBroke ends a non-streamed answer that broke off before it was whole:
// the client has seen nothing, so it gets the error answer (or, for the
// prefill's, the split goes on as after any failed prefill).
func (lg *laneLeg) rawBroke(err error) {
	lc := lg.lc
	if le := (*upstream.LegError)(nil); !errors.As(err, &le) {
		err = &upstream.LegError{Addr: lg.addr, Op: "read", Err: err}
	}
	lg.dropRaw()
	lg.endUp(false)
	if lg.prefill {
		lc.split.prefillFailed(core.PrefillTransportErr(err))
		return
	}
	if c := lc.chunk; c != nil && c.leg {
		c.failed(err)
		return
	}
	if lc.split.pairedSplit().decodeEnded(core.DecodeTransportErr(err)) || lc.split.decodeFirst().failed(err) {
		return
	}
	lc.reply.failWith(core.DecodeTransportErr(err))
}

// dropRaw lets go of the answer being read whole, if any, and of its
// reservation.
func (lg *laneLeg) dropRaw() {
	if lg.raw != nil {
		lg.raw.Hold.Release()
		lg.raw = nil
	}
}

// upFailed handles an engine connection that failed before the answer's
// head: a pooled one the engine had closed while idle is no verdict on the
// engine, so the request is sent once more on a fresh connection;
// otherwise the client gets the error answer.
func (lg *laneLeg) upFailed(err error) {
	fresh := lg.up == nil || lg.up.fresh
	lg.endUp(false)
	if !fresh && !lg.retried && len(lg.head) == 0 &&
		(upstream.IsReset(err) || errors.Is(err, upstream.ErrUpClosed) || errors.Is(err, io.EOF)) {
		lg.retried = true
		lg.dial()
		return
	}
	lg.legFailed(err)
}

// legFailed handles a leg that got no answer head: a failed prefill
// attempt, or a decode leg answered with the error.
func (lg *laneLeg) legFailed(err error) {
	lc := lg.lc
	if lg.prefill {
		lg.head = lg.head[:0]
		lc.split.prefillFailed(core.PrefillTransportErr(err))
		return
	}
	lc.failed(err)
}

// endUp lets go of the engine connection: pooled when its answer was read
// whole, else closed.
func (lg *laneLeg) endUp(clean bool) {
	lc := lg.lc
	u := lg.up
	if u == nil {
		return
	}
	lg.up = nil
	if clean && u.keep && u.watched && !u.writing {
		lc.ll.put(u)
		return
	}
	u.close()
}

// putSent gives back the leg's buffers: the leg as sent, and a long body
// of its own.
func (lg *laneLeg) putSent() {
	lc := lg.lc
	bufs := &lc.ll.ln.p.Bufs
	lg.unsent, lg.unsentBdy = nil, nil
	if lg.sentp != nil {
		bufs.PutChunk(lg.sentp, lg.sent)
		lg.sentp, lg.sent = nil, nil
	}
	bufs.PutScratch(lg.sentBodyp)
	lg.sentBody, lg.sentBodyp = nil, nil
}

// The leg's part of the connection's relay.StreamConns (its loopStream's).

func (lc *laneConn) LegEnd(clean bool) { lc.leg.endUp(clean) }
func (lc *laneConn) LegPause() error   { return lc.leg.up.unwatch() }
func (lc *laneConn) LegResume() error  { return lc.leg.up.watch() }

// prefillHead begins reading the prefill's answer, whose head is in
// ll.resp, rest the body bytes that came with it.
func (lg *laneLeg) prefillHead(rest []byte) {
	lc := lg.lc
	lg.up.fresh = false
	lg.head = nil
	lc.state = laneAnswer
	if lc.ll.resp.ConnectionClose() {
		lg.up.keep = false
	}
	lg.readWhole(upstream.HeadDecoder(&lc.ll.resp), rest)
}

// dropLeg lets go of the request's leg to the local engine, before
// anything of it reached the client: a dial on its way, the leg in
// flight, its answer being read or its stream held. Its connection is
// closed, so the engine aborts it; the request goes on.
func (lg *laneLeg) dropLeg() {
	lc := lg.lc
	lg.dials++
	lc.timer.stopTimer()
	if lc.reply.ls != nil {
		lc.reply.dropStream()
	}
	lg.dropRaw()
	lg.endUp(false)
	lg.putSent()
	lc.state = laneSending
}
