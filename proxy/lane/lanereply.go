package lane

import (
	"bytes"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
	"github.com/pd-sidecar/pd-sidecar/proxy/sserelay"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// laneReply is a connection's answer to its client: written whole, or
// relayed as a stream through a loopStream, and the stream let go of when
// the client never saw it.
type laneReply struct {
	lc       *laneConn
	ls       *relay.LoopStream
	streamed bool   // the answer is a stream (counted in LoopStreams)
	finish   func() // lc.finish, made once: every stream's Release
}

// answer begins the answer: its head, read into ll.resp, and rest, the
// body bytes that came with it.
func (rp *laneReply) answer(rest []byte) {
	lc := rp.lc
	ll, r := lc.ll, lc.r
	lc.leg.up.fresh = false
	lc.leg.putSent()
	lc.leg.head = nil
	r.Obs.Status = ll.resp.StatusCode()
	lc.state = laneAnswer
	if ll.resp.ConnectionClose() {
		lc.leg.up.keep = false
	}
	dec := upstream.HeadDecoder(&ll.resp)
	if !bytes.HasPrefix(ll.resp.ContentType(), core.EventStream) || upstream.Bodiless(r.Obs.Status) {
		lc.timer.stopTimer()
		lc.leg.readWhole(dec, rest)
		return
	}
	// The head waits for the stream's first event (its first output for a
	// decode on remote KV), as relaySSE's does; so does the first-byte
	// timer, when there is one.
	ls := rp.newStream(dec)
	ls.Rewrite = r.LocalAnswerEdit() // a split's decode leg's is AnswerEdit (gateStream)
	switch {
	case lc.shadowOf != nil:
		// A hedge's local leg: held until its first output.
		ls.Gate, ls.Gated = sserelay.GateHolding, lc.split.hedgeGated
	case lc.split.decodeFirst() != nil:
		lc.split.decodeFirst().gate(ls)
	case r.Handoff != nil:
		lc.split.gateStream(ls)
	default:
		ls.Gate, ls.Gated = sserelay.GateFirstEvent, rp.began
	}
	rp.streamed = true
	r.P.M.LoopStreams.Inc()
	_, out := ll.loop.Buffers()
	out = rp.appendHead(out, &ll.resp, -1)
	out = ls.Relayed(out, rest, false, nil)
	ls.Deliver(out)
}

// newStream relays the answer's body on the loop from here, as a stream
// handed over by fasthttp is.
func (rp *laneReply) newStream(dec httpbody.Decoder) *relay.LoopStream {
	lc := rp.lc
	ll, r := lc.ll, lc.r
	ls := &relay.LoopStream{R: r, Loop: ll.loop, KeepAlive: lc.client.keepAlive, CFD: lc.client.fd, UFD: -1,
		Stream: sserelay.Stream{Body: dec, API: r.API, MaxEvent: r.P.Cfg.MaxSSEEventBytes}}
	if lc.leg.up != nil {
		ls.UFD = lc.leg.up.fd
	}
	if rp.finish == nil {
		rp.finish = lc.finish
	}
	ls.Release = rp.finish
	ls.Conns = lc
	rp.ls = ls
	return ls
}

// appendHead appends the client's answer head: h's status and end-to-end
// headers, our request id, the body framed by contentLength (-1: chunked).
func (rp *laneReply) appendHead(out []byte, h *fasthttp.ResponseHeader, contentLength int) []byte {
	lc := rp.lc
	if lc.ll.ln.p.Draining.Load() {
		lc.client.keepAlive = false
	}
	return rawhttp.AppendAnswerHead(out, h, lc.r.ID, contentLength, lc.client.keepAlive)
}

// writeWhole writes a complete answer (head h, body) through a loopStream
// that has nothing more to read.
func (rp *laneReply) writeWhole(h *fasthttp.ResponseHeader, body []byte) {
	lc := rp.lc
	ls := rp.newStream(httpbody.New(httpbody.Length, 0))
	ls.Ended, ls.UpEnded = true, true
	ls.MarkOutput()
	_, out := lc.ll.loop.Buffers()
	out = rp.appendHead(out, h, len(body))
	out = append(out, body...)
	lc.state = laneAnswer
	ls.Write(out)
}

// failWith answers err as the fasthttp path's Fail does: the client has
// seen nothing yet.
func (rp *laneReply) failWith(err error) {
	lc := rp.lc
	if lc.shadowOf != nil {
		lc.shadowOf.split.shadowFailed(lc, err)
		return
	}
	lc.timer.stopTimer()
	lc.leg.putSent()
	o := lc.r.Failure(err)
	lc.r.AnswerCounted(lc.r.Mode, o.Status)
	h := rp.ownHead(o.Status, "application/json")
	if o.RetryAfter {
		h.Set("Retry-After", "1")
	}
	rp.writeWhole(h, o.Body)
}

// answerWhole writes a complete answer the sidecar made, as the fasthttp
// path's answer does.
func (rp *laneReply) answerWhole(mode string, status int, contentType string, body []byte) {
	lc := rp.lc
	lc.r.AnswerCounted(mode, status)
	rp.writeWhole(rp.ownHead(status, contentType), body)
}

// ownHead returns the loop's answer head, reset to one the sidecar makes.
func (rp *laneReply) ownHead(status int, contentType string) *fasthttp.ResponseHeader {
	lc := rp.lc
	h := &lc.ll.resp
	h.Reset()
	h.SetStatusCode(status)
	h.SetContentType(contentType)
	return h
}

// began relays a local stream once its first event came: the answer
// begins.
func (rp *laneReply) began(g sserelay.Gate, held []byte) {
	lc := rp.lc
	ls := rp.ls
	lc.timer.stopTimer()
	if g != sserelay.GateOutput { // ended with no event
		rp.dropStream()
		rp.failWith(core.EndedBefore(lc.r.Local, "any event", ls.Cut))
		return
	}
	rp.relayHeld(held)
}

// relayHeld begins the answer's stream: counted, its first output marked,
// the bytes held back until then written.
func (rp *laneReply) relayHeld(held []byte) {
	r, ls := rp.lc.r, rp.ls
	r.StreamBegan(r.Obs.Status)
	ls.MarkOutput()
	rp.firstOutput()
	ls.Write(held)
}

// firstOutput records that the first event is being relayed: the
// request's time to first token.
func (rp *laneReply) firstOutput() {
	lc := rp.lc
	r := lc.r
	r.P.M.TTFT.WithLabelValues(r.Mode).Observe(time.Since(r.Start).Seconds())
}

// FirstOutput is the answer's part of the connection's relay.StreamConns.
func (lc *laneConn) FirstOutput() { lc.reply.firstOutput() }

// dropStream ends a held stream the client never saw: its leg is closed,
// and the request goes on.
func (rp *laneReply) dropStream() {
	lc := rp.lc
	ls := rp.ls
	ls.Finished = true
	ls.CloseLeg(false)
	rp.ls = nil
	lc.state = laneSending
	if rp.streamed {
		rp.streamed = false
		lc.r.P.M.LoopStreams.Dec()
	}
}
