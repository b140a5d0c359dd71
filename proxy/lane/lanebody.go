package lane

import (
	"errors"
	"time"

	"github.com/pd-sidecar/pd-sidecar/netloop"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// A request whose body is not whole in the loop's first read — a long
// prompt (the loop reads 16 KiB at a time), or a body the client wrote
// after its head (Go's HTTP client writes through a 4 KiB buffer, a proxy
// may send head and body apart) — is read on the lane too, straight from
// the socket into one buffer of the whole request's size (upstream.BodyPool), and
// served there as a request read whole is — the request keeps the buffer
// until it finishes, and its legs send the body from it, behind their
// heads in one writev (legTo), not from copies —: not handed to fasthttp, which
// would take a goroutine, read the bytes again through its own buffers and
// grow its body buffer by doubling. Its body is reserved from
// --max-buffered-bytes before it is read, as fasthttp's path reserves it
// (guard.BodyHolds); a body the budget refuses is handed to fasthttp, which
// refuses it (503) as it refuses its own. A body not read whole within half
// of --read-timeout is handed to fasthttp with the bytes read so far, and
// fasthttp reads the rest by --read-timeout from the request's first bytes
// (clientconn.Conn.Replay; 408 past it, as on fasthttp's path alone): a slow or
// stalled client holds the lane's buffer for a bounded time, and is
// answered as fasthttp answers it. A head that is not whole in the first
// read is fasthttp's, by the same deadline.

// laneBody is a request being read whole on the lane.
type laneBody struct {
	bufp *[]byte
	buf  []byte // the request so far: head and body read
	want int    // the whole request's length
	held int64  // reserved from --max-buffered-bytes
	// start is when the request's first bytes were read: it is read whole
	// by --read-timeout from then, here or on fasthttp's path.
	start time.Time
	// lowat is the client socket's SO_RCVLOWAT while the rest is awaited
	// (0: the default): the loop is woken once the rest is there, not for
	// every segment of it.
	lowat int
}

// beginBody begins reading the rest of request b, whose head is headLen
// bytes and which takes want bytes in all.
func (cl *laneClient) beginBody(b []byte, headLen, want int) {
	lc := cl.lc
	p := lc.ll.ln.p
	var held int64
	if n := int64(want - headLen); n > upstream.UnreservedBody {
		if !p.Guard.Budget().TryReserve(n) {
			cl.toServer(b, time.Now()) // refused there, as fasthttp refuses its own
			return
		}
		held = n
	}
	lb := &laneBody{bufp: p.Bufs.Bodies.Get(want), want: want, held: held, start: time.Now()}
	lb.buf = append(*lb.bufp, b...)
	cl.body, lc.state = lb, laneReading
	lc.timer.startTimer(p.Cfg.Guard.ReadTimeout/2, cl.bodyStalled)
	cl.readBody()
}

// readBody reads what the client sent of the body, and serves the request
// once it is whole.
func (cl *laneClient) readBody() {
	lc := cl.lc
	lb := cl.body
	for len(lb.buf) < lb.want {
		n, err := netloop.Read(cl.fd, lb.buf[len(lb.buf):lb.want])
		switch {
		case errors.Is(err, netloop.ErrWouldBlock):
			cl.awaitBody(lb)
			return
		case err != nil || n == 0:
			cl.close() // the client left mid-body
			return
		}
		lb.buf = lb.buf[:len(lb.buf)+n]
	}
	lc.timer.stopTimer()
	if cl.lowWaterBack(lb); lc.state == laneGone {
		return // closed, lb given back
	}
	cl.body, lc.state = nil, laneIdle
	// The loop's header was another connection's meanwhile: parsed again.
	api, headLen, want, lr, ok := lc.ll.parseHead(lb.buf)
	if !ok || want != len(lb.buf) {
		cl.toServer(lb.buf, lb.start) // draining since, say
		cl.dropBody(lb)
		return
	}
	// The request keeps its body until it finishes (finish): its legs
	// send from it.
	cl.reqBody = lb
	lc.serve(lb.buf, api, headLen, lr)
	if lc.r == nil { // not served (fasthttp's), or over already
		cl.dropReqBody()
	}
}

// dropReqBody gives back the body of the request that was being served.
func (cl *laneClient) dropReqBody() {
	if lb := cl.reqBody; lb != nil {
		cl.reqBody = nil
		cl.dropBody(lb)
	}
}

// awaitBody asks to be woken when the rest of lb is there: its socket's
// low-water mark set to what is missing (the kernel caps it, and wakes the
// loop early when its buffer fills; past the cap, each wake-up sets the
// mark again).
func (cl *laneClient) awaitBody(lb *laneBody) {
	rest := lb.want - len(lb.buf)
	if rest == lb.lowat || rest <= 1 {
		return
	}
	if netloop.SetReadLowWater(cl.fd, rest) == nil {
		lb.lowat = rest
	}
}

// lowWaterBack sets the client socket's low-water mark back to the
// default once lb is read or given up: the next request's head, or
// fasthttp's reads, must wake on any byte.
func (cl *laneClient) lowWaterBack(lb *laneBody) {
	if lb.lowat == 0 {
		return
	}
	lb.lowat = 0
	if err := netloop.SetReadLowWater(cl.fd, 1); err != nil {
		cl.close() // a connection that could hang unseen is not kept; lb is given back
	}
}

// bodyStalled hands a body not read whole in time to fasthttp.
func (cl *laneClient) bodyStalled() {
	lc := cl.lc
	lb := cl.body
	if lc.state != laneReading || lb == nil {
		return
	}
	if cl.lowWaterBack(lb); lc.state == laneGone {
		return // closed, lb given back
	}
	cl.body = nil
	cl.toServer(lb.buf, lb.start) // copies what was read
	cl.dropBody(lb)
}

// dropBody gives back a body's reservation and buffer.
func (cl *laneClient) dropBody(lb *laneBody) {
	lc := cl.lc
	if lb == nil {
		return
	}
	p := lc.ll.ln.p
	p.Guard.Budget().Release(lb.held)
	lb.held = 0
	*lb.bufp = lb.buf
	p.Bufs.Bodies.Put(lb.bufp)
	lb.bufp = nil
}
