package lane

import (
	"bufio"
	"bytes"
	"context"
	"io"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// A prefill leg over TLS (--enable-tls with prefiller) is one the lane's
// raw, non-blocking connections cannot carry: crypto/tls works on a
// blocking net.Conn. Such a leg is sent by the proxy's transport off the
// loop, as a dial is, with the transport's TLS, pools and bounds on the
// answer (read whole, as every prefill answer is); the answer comes back
// to the loop, where the split goes on as after a raw answer. Everything
// else of the request (its admission, the split's decisions, the decode
// leg and the stream to the client) stays on the loop.

// offLoopLeg is a connection's leg sent off the loop, while it runs.
type offLoopLeg struct {
	cancel context.CancelFunc
}

// offLoop reports whether lc's leg is sent off the loop.
func offLoop(lc *laneConn) bool {
	return lc.leg.prefill && lc.ll.ln.p.Cfg.Guard.TLS.Prefiller
}

// send sends the leg in lc.leg.sent (and sentBody) to its addr through the
// proxy's transport, off the loop.
func (o *offLoopLeg) send(lc *laneConn) {
	ll, r, p, addr := lc.ll, lc.r, lc.ll.ln.p, lc.leg.addr
	lc.state = laneSending
	lc.leg.dials++
	n := lc.leg.dials
	req := fasthttp.AcquireRequest()
	// Parsed from the leg as the lane wrote it (head, then a long body
	// where it lies): the request copies what it keeps.
	if err := req.Read(bufio.NewReader(io.MultiReader(bytes.NewReader(lc.leg.sent), bytes.NewReader(lc.leg.sentBody)))); err != nil {
		fasthttp.ReleaseRequest(req)
		lc.leg.legFailed(&upstream.LegError{Addr: addr, Op: "write", Err: err})
		return
	}
	ctx, cancel := context.WithCancel(r.Ctx)
	o.cancel = cancel
	go func() {
		resp := fasthttp.AcquireResponse()
		hold, err := p.Tr.Do(ctx, addr, req, resp)
		fasthttp.ReleaseRequest(req)
		done := func() {
			hold.Release() // what the split keeps of the answer is a copy
			fasthttp.ReleaseResponse(resp)
			cancel()
		}
		if !ll.loop.Post(func() { o.done(lc, r, n, resp, err); done() }) {
			done()
		}
	}()
}

// done goes on from lc's leg number n of request r, on the loop: its
// answer resp, or its failure err.
func (o *offLoopLeg) done(lc *laneConn, r *core.Request, n uint64, resp *fasthttp.Response, err error) {
	mu := lc.lock()
	mu.Lock()
	defer mu.Unlock()
	if lc.state != laneSending || lc.r != r || lc.leg.dials != n {
		return // cancelled meanwhile
	}
	o.cancel = nil
	if err != nil {
		lc.leg.legFailed(err)
		return
	}
	lc.state = laneAnswer
	a := &rawhttp.Answer{Status: resp.StatusCode(), Buf: resp.Body()}
	resp.Header.CopyTo(&a.Head)
	if lc.shadowOf != nil {
		lc.shadowOf.split.shadowWhole(lc, a)
		return
	}
	lc.split.PrefillAnswered(a)
}

// stop cancels the leg, if one runs.
func (o *offLoopLeg) stop() {
	if o.cancel != nil {
		o.cancel()
		o.cancel = nil
	}
}
