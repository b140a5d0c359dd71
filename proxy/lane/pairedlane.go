package lane

import (
	"context"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/sserelay"
)

// The lane's driver of a paired split (split.Paired: SGLang, Mooncake, the
// offloading connector, MoRI-IO's parallel dispatch), on the event loop.
// Both legs go out at once: the decode leg on the request's own laneConn,
// its stream held until its first output as a sequential split's is; the
// prefill leg on a shadow laneConn of the same loop (as the hedge's local
// leg is: the request's, sharing its lock, never writing to the client),
// its answer read whole and then discarded, the KV going from engine to
// engine. The legs are built, the prefill answer judged and the machine's
// accounting done by proxy/inference, as fasthttp's driver has them done;
// the lane only sends, reads and feeds the machine what happened. A
// prefiller's bootstrap answer (Mooncake's) not in the cache is asked for
// off the loop, as a dial is, and the split goes on on the loop.

// lanePaired is the lane's driver of one request's paired split: lanePD's
// part while it runs.
type lanePaired struct {
	lc      *laneConn // the request's (the decode leg's)
	pd      *lanePD
	pm      *split.Paired
	pp      *core.Paired
	pre     *laneConn              // the prefill leg's shadow, while it runs
	preLeg  *core.PairedPrefillLeg // its bookkeeping
	preHead []byte                 // its own head start (--prefill-strip-headers), nil: the split's
	preBufp *[]byte
	// decoding: the decode leg is out and the machine has not been told
	// of its end.
	decoding bool
	timers   [split.Timers]*time.Timer
	// ending: the request is ending; only the legs' actions are done.
	ending bool
	// The decode's first output while the machine holds it (HoldOutput):
	// a stream's held bytes (its upstream unwatched meanwhile), or a JSON
	// answer read whole.
	heldOut   []byte
	heldWhole *heldAnswer
}

// heldAnswer is a decode leg's JSON answer, kept until the machine lets
// it through.
type heldAnswer struct {
	head fasthttp.ResponseHeader
	body []byte
}

// runPaired runs the paired split of lc's request (beginSplit readied it)
// with the prefiller Admit named.
func runPaired(lc *laneConn) {
	ll, r, p, pd := lc.ll, lc.r, lc.ll.ln.p, lc.split.pd
	s := core.BeginPaired(r)
	ps := &lanePaired{lc: lc, pd: pd, pp: s, pm: split.NewPaired(s.Config)}
	pd.paired = ps
	if len(p.PrefillStrip) > 0 { // the loop's head is another request's by the time a bootstrap answer comes
		ps.preBufp, ps.preHead = p.Bufs.GetChunk()
		ps.preHead = rawhttp.AppendLegStartStrip(ps.preHead, &ll.req, p.PrefillStrip)
	}
	if step := s.Prepare(r); step != nil {
		lc.runStep(step, ps.start)
		return
	}
	ps.start()
}

// start starts the machine.
func (ps *lanePaired) start() {
	ps.pd.feeding = true
	ps.exec(ps.pm.Start(ps.pp.Start))
	ps.lc.split.drainSplit(ps.pd)
}

// exec executes the machine's actions.
func (ps *lanePaired) exec(acts []split.Action) {
	lc, pd := ps.lc, ps.pd
	r := lc.r
	for _, a := range acts {
		if lc.split.pd != pd {
			return // the request ended meanwhile
		}
		if ps.pp.Account(a, r.Logger()) {
			continue
		}
		switch a.Op {
		case split.SendPrefill:
			ps.sendPrefill()
			continue
		case split.AbandonPrefill:
			if h := ps.pre; h != nil {
				cause := a.Err
				if cause == nil {
					cause = context.Canceled
				}
				ps.prefillEnded(h, nil, core.PrefillTransportErr(fmt.Errorf("%w (%w)", cause, context.Canceled)))
			}
			continue
		case split.CancelPrefill:
			if h := ps.pre; h != nil {
				ps.prefillEnded(h, nil, core.PrefillTransportErr(fmt.Errorf("%w (%w)", a.Err, context.Canceled)))
			}
			continue
		case split.Arm:
			t := a.Timer
			ps.stopTimer(t)
			ps.timers[t] = time.AfterFunc(a.After, func() {
				lc.onLoop(r, func() { lc.split.feedSplit(split.Event{Kind: split.TimerFired, Timer: t}) })
			})
			continue
		case split.Disarm:
			ps.stopTimer(a.Timer)
			continue
		case split.CancelDecode:
			ps.cancelDecode(a.Err)
			continue
		}
		if ps.ending {
			continue // the request is over: nothing more reaches the client
		}
		switch a.Op {
		case split.SendDecode:
			ps.decoding = true
			ps.pp.DecodeSent(r)
			lc.decodeLeg(ps.pp.Dec, nil, true)
		case split.ReleaseOutput:
			ps.releaseHeld()
		case split.SendLocal:
			ps.pp.DecodeDropped(r)
			lc.decodeLeg(r.Body, nil, false)
		case split.PassOn:
			ps.pp.DecodeDropped(r)
			lc.split.splitAnswers(a)
		case split.Fail:
			lc.split.splitAnswers(a)
		case split.Degraded:
			r.Degraded(a.Reason, a.Err)
		}
	}
}

// stopTimer stops the split's timer t, if armed (a fire on its way to the
// loop is the machine's to ignore).
func (ps *lanePaired) stopTimer(t split.Timer) {
	if tm := ps.timers[t]; tm != nil {
		tm.Stop()
		ps.timers[t] = nil
	}
}

// sendPrefill sends the prefill leg on a shadow of the request's
// connection, until the machine cancels it.
func (ps *lanePaired) sendPrefill() {
	lc, pd := ps.lc, ps.pd
	ll, r, p := lc.ll, lc.r, lc.ll.ln.p
	h := newConn(ll)
	h.client.cc, h.client.fd, h.client.keepAlive, h.r, h.split.pd, h.shadowOf, h.leg.prefill = lc.client.cc, lc.client.fd, lc.client.keepAlive, r, pd, lc, true
	ps.pre = h
	ps.preLeg = ps.pp.StartPrefill(r) // before the head, which names its span
	h.leg.sentp, h.leg.sent = p.Bufs.GetChunk()
	if ps.preHead != nil {
		h.leg.sent = append(h.leg.sent, ps.preHead...)
	} else {
		h.leg.sent = append(h.leg.sent, pd.start...)
	}
	h.leg.legTo(r.Prefiller, ps.pp.Pre, nil)
}

// prefillEnded ends the prefill leg h with its answer a (read whole), or
// the failure err, and tells the machine what it meant.
func (ps *lanePaired) prefillEnded(h *laneConn, a *rawhttp.Answer, err error) {
	lc := ps.lc
	if lc.split.pd != ps.pd || ps.pre != h {
		return
	}
	ps.pre = nil
	h.leg.dials++ // a dial on its way is let go
	h.leg.off.stop()
	h.timer.stopTimer()
	h.leg.dropRaw()
	h.leg.endUp(false)
	h.leg.putSent()
	h.r, h.state = nil, laneGone
	var status int
	var ct, body []byte
	if a != nil {
		status, ct, body = a.Status, a.Head.ContentType(), a.Buf
	}
	if err = ps.preLeg.End(status, ct, body, err); err != nil {
		lc.split.feedSplit(split.Event{Kind: split.PrefillFailed, Err: err})
		return
	}
	lc.split.feedSplit(split.Event{Kind: split.PrefillAnswered})
}

// decodeEnded tells the machine that the decode leg ended: err nil once
// its answer is written or streaming, else its failure before any output
// reached the client. It reports false when no decode leg of the split is
// out (ps nil included: the failure is then the caller's).
func (ps *lanePaired) decodeEnded(err error) bool {
	if ps == nil || !ps.decoding || ps.lc.split.pd != ps.pd {
		return false
	}
	ps.decoding = false
	ps.lc.split.feedSplit(split.Event{Kind: split.DecodeEnded, Err: err})
	return true
}

// cancelDecode closes the decode leg, which has produced no output, and
// tells the machine it ended with cause.
func (ps *lanePaired) cancelDecode(cause error) {
	lc := ps.lc
	if !ps.decoding {
		return
	}
	lc.leg.dropLeg()
	ps.decodeEnded(cause)
}

// gated decides on the held decode stream: its first output came
// (relayed, or held while the machine says so); a KV load failure, or a
// stream that ended with none, goes to the machine.
func (ps *lanePaired) gated(g sserelay.Gate, held []byte) {
	lc, pd := ps.lc, ps.pd
	r, ls := lc.r, lc.reply.ls
	lc.timer.stopTimer()
	switch g {
	case sserelay.GateHolding: // ended with no output
		lc.reply.dropStream()
		ps.decodeEnded(core.EndedBefore(r.Local, "any output", ls.Cut))
		return
	}
	if err := r.KVStreamed(pd.sent, g == sserelay.GateError); err != nil {
		lc.reply.dropStream()
		ps.decodeEnded(err)
		return
	}
	if g != sserelay.GateError {
		lc.split.feedSplit(split.Event{Kind: split.FirstOutput})
		if lc.split.pd != pd {
			return
		}
		if ps.pm.Holding() {
			ps.heldOut = append(ps.heldOut[:0], held...)
			if !ls.Ended {
				if err := lc.LegPause(); err != nil {
					ls.Fail(err)
				}
			}
			return
		}
	}
	ps.relay(held)
}

// relay relays the decode stream from its held bytes on: its answer
// begins.
func (ps *lanePaired) relay(held []byte) {
	ps.decodeEnded(nil) // before the write, which may end the request
	ps.lc.reply.relayHeld(held)
}

// answered takes the decode answer, read whole: a KV load failure goes to
// the machine; an answer that is output (core.IsOutput) is its first
// (held while the machine says so); any answer is then written.
func (ps *lanePaired) answered(a *rawhttp.Answer) {
	lc, pd := ps.lc, ps.pd
	r := lc.r
	if err := r.KVAnswered(pd.sent, a.Status); err != nil {
		ps.decodeEnded(err)
		return
	}
	buf := r.AnswerBody(a.Status, a.Buf)
	if core.IsOutput(a.Status) {
		lc.split.feedSplit(split.Event{Kind: split.FirstOutput})
		if lc.split.pd != pd {
			return
		}
		if ps.pm.Holding() {
			w := &heldAnswer{body: append([]byte(nil), buf...)}
			a.Head.CopyTo(&w.head)
			ps.heldWhole = w
			return
		}
	}
	ps.write(&a.Head, a.Status, buf)
}

// write writes the decode answer, read whole.
func (ps *lanePaired) write(h *fasthttp.ResponseHeader, status int, body []byte) {
	ps.decodeEnded(nil) // before the write, which may end the request
	ps.lc.r.JSONAnswered(status)
	ps.lc.reply.writeWhole(h, body)
}

// releaseHeld lets the decode's held first output through.
func (ps *lanePaired) releaseHeld() {
	lc := ps.lc
	if w := ps.heldWhole; w != nil {
		ps.heldWhole = nil
		ps.write(&w.head, w.head.StatusCode(), w.body)
		return
	}
	ls := lc.reply.ls
	if ls == nil || ps.heldOut == nil {
		return
	}
	held := ps.heldOut
	ps.heldOut = nil
	if !ls.Ended {
		if err := lc.LegResume(); err != nil {
			ls.Fail(err)
			return
		}
	}
	ps.relay(held)
}

// end ends the split with its request: a prefill leg still out is
// abandoned (its end says nothing of the prefiller), as fasthttp's
// driver's is when the request's context ends.
func (ps *lanePaired) end() {
	lc, pd := ps.lc, ps.pd
	if ps.ending || lc.split.pd != pd {
		return
	}
	ps.ending, pd.feeding = true, true
	for t := range ps.timers {
		ps.stopTimer(split.Timer(t))
	}
	// Fed now, whatever is under way: the request ends here.
	pd.queue = append(pd.queue, split.Event{Kind: split.ClientGone, Err: context.Canceled})
	for lc.split.pd == pd && len(pd.queue) > 0 {
		ev := pd.queue[0]
		pd.queue = pd.queue[1:]
		ps.exec(ps.pm.On(ev))
	}
	if h := ps.pre; h != nil { // not abandoned by the machine: it had its outcome
		ps.prefillEnded(h, nil, core.PrefillTransportErr(context.Canceled))
	}
	pd.queue, pd.feeding = nil, false
	ps.pp.Abandon(lc.r.Logger()) // the legs were never sent (a bootstrap query under way)
	lc.ll.ln.p.Bufs.PutChunk(ps.preBufp, ps.preHead)
	ps.preBufp, ps.preHead = nil, nil
}
