package lane

import (
	"errors"
	"fmt"
	"time"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/sserelay"
)

// The lane's driver of the sequential split (split.Sequential), on the
// event loop. The prefill leg goes out on a pooled connection to the
// prefiller and its answer is read whole; the decode leg goes to the local
// engine, its stream held until its first output so that a KV load
// failure is recovered before the client saw anything. Timers and dials
// come back to the loop (onLoop), and every event goes to the machine; the
// driver only executes what it returns. Events that arise while actions
// run (a send that fails at once) are queued and fed once they are done,
// so the machine never sees an event in the middle of its own output.
//
// The hedge's local leg runs on a shadow laneConn: the request's, on the
// same loop, with the client's descriptor but never writing to it, sharing
// its primary's lock (laneConn.lock). It is the plain local leg
// (decodeLeg), its stream held until its first output (sserelay.GateHolding), a
// JSON answer read whole. Dropping it closes its connection, so the engine
// aborts it; relaying it makes the primary adopt its stream, connection
// and gauge, and relay from the held bytes on, as a local stream that
// began.

// errHedgeAbandoned: a hedge's local leg ended by the sidecar (the loop
// shutting down).
var errHedgeAbandoned = errors.New("hedge's local leg abandoned")

// lanePD is a split's state on the lane.
type lanePD struct {
	bufp  *[]byte
	buf   []byte // start, then the client's body
	start []byte // the legs' shared head start (rawhttp.AppendLegStart)

	m       *split.Sequential
	queue   []split.Event // events that arose while actions ran
	feeding bool

	body    []byte // the prefill leg's body, in scratch
	scratch *[]byte
	seq     core.Sequential    // the request's side of the split
	done    func(error)        // records the prefill's end (PrefillStarted)
	res     core.PrefillResult // the prefill's answer
	sent    time.Time          // the decode leg's start, for the KV handoff's duration

	hedge *laneConn // the hedge's local leg's shadow, while it runs
	// ready is the shadow's answer while it is handed to the primary: its
	// stream's held bytes, or its JSON answer read whole.
	readyHeld []byte
	readyRaw  *rawhttp.Answer

	paired *lanePaired // a paired split's driver (nil: the sequential split's, m)
	// first is a decode-first attempt's while it runs; triedFirst: the
	// request had its attempt (the usual split runs from here).
	first      *laneFirst
	triedFirst bool
}

// laneSplit is a connection's part in its request's P/D split: the
// sequential split's execution (its machine fed and its actions done), the
// hedge's local leg run on a shadow, and the paired and decode-first
// drivers reached through pd.
type laneSplit struct {
	lc *laneConn
	pd *lanePD // the P/D split's state (nil: a local request)
	// prefillDue (--prefill-timeout) and hedgeDue (the hedge point) are
	// the sequential split's timers, kept with the connection so that a
	// split arms them without an allocation; fires feed each timer's
	// firing to the machine (made once).
	prefillDue, hedgeDue loopTimer
	fires                [split.Timers]func()
	gated                func(sserelay.Gate, []byte) // gateDone, made once
}

// beginSplit readies the split of a request that names a prefiller (or
// one whose admission runs off the loop), before anything reads its body:
// the legs' head start (a split's, or a local leg's), and the body copied
// out of the loop's buffer (which the next read overwrites), for the legs
// sent after this event.
func (sp *laneSplit) beginSplit(named bool) {
	lc := sp.lc
	ll, r, p := lc.ll, lc.r, lc.ll.ln.p
	pd := &lanePD{}
	strip := p.LegStrip
	if named {
		strip = p.SplitStrip
	}
	pd.bufp, pd.buf = p.Bufs.GetChunk()
	pd.buf = rawhttp.AppendLegStartStrip(pd.buf, &ll.req, strip)
	n := len(pd.buf)
	if lc.client.reqBody == nil {
		pd.bufp, pd.buf = p.Bufs.GrowChunk(pd.bufp, pd.buf, len(r.Body))
		pd.buf = append(pd.buf, r.Body...)
		r.Body = pd.buf[n:]
	}
	pd.start = pd.buf[:n:n]
	sp.pd = pd
}

// run runs the P/D split of the request (beginSplit readied it) with
// the prefiller Admit named.
func (sp *laneSplit) run() {
	lc := sp.lc
	r, p, pd := lc.r, lc.ll.ln.p, sp.pd
	switch {
	case p.PairedSplit():
		runPaired(lc)
		return
	case p.Choreo == connectors.ChoreographyDecodeFirst && !pd.triedFirst:
		runDecodeFirst(lc)
		return
	}
	scratch, dst := p.Bufs.EditScratch(len(r.Body))
	pd.seq = core.BeginSequential(r)
	body, err := pd.seq.PrefillBody(dst)
	start, sends := pd.seq.Start(err)
	if sends {
		pd.body, pd.scratch = body, scratch
	} else {
		p.Bufs.PutScratch(scratch)
	}
	pd.m = split.NewSequential(p.SplitConfig())
	pd.feeding = true
	sp.execSplit(pd, pd.m.Start(start))
	sp.drainSplit(pd)
}

// feedSplit gives the split's machine ev, unless actions are running (then
// it is queued for when they are done).
func (sp *laneSplit) feedSplit(ev split.Event) {
	pd := sp.pd
	if pd == nil || (pd.m == nil && pd.paired == nil && pd.first == nil) {
		return
	}
	pd.queue = append(pd.queue, ev)
	if pd.feeding {
		return
	}
	pd.feeding = true
	sp.drainSplit(pd)
}

// drainSplit feeds the queued events while the request is pd's.
func (sp *laneSplit) drainSplit(pd *lanePD) {
	for sp.pd == pd && len(pd.queue) > 0 {
		ev := pd.queue[0]
		pd.queue = pd.queue[1:]
		switch {
		case pd.paired != nil:
			pd.paired.exec(pd.paired.pm.On(ev))
		case pd.first != nil:
			pd.first.exec(pd.first.m.On(ev))
		case pd.m != nil:
			sp.execSplit(pd, pd.m.On(ev))
		}
	}
	pd.feeding = false
}

// execSplit executes the machine's actions for the split pd.
func (sp *laneSplit) execSplit(pd *lanePD, acts []split.Action) {
	lc := sp.lc
	ll, r, p := lc.ll, lc.r, lc.ll.ln.p
	// The machine's slice holds until its next event: copied (on the
	// stack), so that an action that ends the request early, which tells
	// the machine at once (endSplitEarly), leaves the rest to run.
	var own [8]split.Action
	acts = append(own[:0], acts...)
	for _, a := range acts {
		if sp.pd != pd {
			return // the request ended meanwhile
		}
		switch a.Op {
		case split.SendPrefill:
			if a.Plain && !sp.rebuildPrefill(pd) {
				continue
			}
			sp.sendPrefill(pd, a.Attempt, a.Plain)
		case split.CancelPrefill:
			if lc.leg.prefill {
				// Its connection closed, so the prefiller drops the
				// request; a dial on its way is let go.
				lc.leg.dials++
				lc.leg.off.stop()
				lc.timer.stopTimer()
				lc.leg.endUp(false)
				lc.leg.dropRaw()
				lc.leg.putSent()
			}
		case split.Arm:
			sp.armSplit(a.Timer, a.After)
		case split.Disarm:
			switch a.Timer {
			case split.TimerPrefill:
				sp.prefillDue.stop()
			case split.TimerHedge:
				sp.hedgeDue.stop()
			case split.TimerBackoff:
				lc.timer.stopTimer()
			}
		case split.SendHedge:
			h := newConn(ll)
			h.client.cc, h.client.fd, h.client.keepAlive, h.r, h.split.pd, h.shadowOf = lc.client.cc, lc.client.fd, lc.client.keepAlive, r, pd, lc
			pd.hedge = h
			h.decodeLeg(r.Body, nil, false)
		case split.DropHedge:
			sp.dropHedge()
		case split.RelayHedge:
			sp.adoptHedge(pd)
		case split.SendDecode:
			sp.takeHandoff(pd, a.Handoff)
		case split.SendLocal:
			pd.seq.Local()
			lc.decodeLeg(r.Body, nil, false)
		case split.AnswerPrefill:
			st, ct, ans, err := pd.seq.PrefillAnswer(pd.res)
			if err != nil {
				sp.feedSplit(split.Event{Kind: split.LegFailed, Err: err})
				continue
			}
			lc.reply.answerWhole(metrics.ModeDisaggregated, st, ct, ans)
		case split.PassOn, split.Fail:
			sp.splitAnswers(a)

		case split.PrefillBegan:
			lc.setGauge(ll.prefill)
			pd.done = pd.seq.PrefillBegan(time.Now())
		case split.PrefillEnded:
			lc.leg.prefill = false
			lc.leg.putSent()
			pd.done(a.Err)
			lc.setGauge(nil)
			p.Bufs.PutScratch(pd.scratch)
			pd.scratch, pd.body = nil, nil
		default:
			pd.seq.Account(a)
		}
	}
}

// sendDecode sends the decode leg carrying the handoff h.
func (sp *laneSplit) sendDecode(pd *lanePD, h connectors.Handoff) {
	lc := sp.lc
	r, p := lc.r, lc.ll.ln.p
	scratch, dst := p.Bufs.EditScratch(len(r.Body))
	body, err := pd.seq.DecodeBody(dst, h)
	if err != nil {
		p.Bufs.PutScratch(scratch)
		sp.feedSplit(split.Event{Kind: split.LegFailed, Err: err})
		return
	}
	lc.decodeLeg(body, scratch, true)
}

// takeHandoff sends the decode leg with the handoff h, once the request
// feature that takes it on its way (a step: Request.HandoffStep, the
// sidecar's own KV pull) handed on the handoff the leg carries.
func (sp *laneSplit) takeHandoff(pd *lanePD, h connectors.Handoff) {
	if !pd.seq.StepsHandoff() {
		sp.sendDecode(pd, h)
		return
	}
	sp.stepHandoff(pd, h)
}

// stepHandoff runs the step that takes the handoff h, then sends the
// decode leg with what it handed on.
func (sp *laneSplit) stepHandoff(pd *lanePD, h connectors.Handoff) {
	lc := sp.lc
	var taken connectors.Handoff
	var err error
	step := pd.seq.HandoffStep(h, func(hh connectors.Handoff, e error) { taken, err = hh, e })
	lc.runStep(step, func() {
		if err != nil {
			sp.feedSplit(split.Event{Kind: split.LegFailed, Err: err})
			return
		}
		sp.sendDecode(pd, taken)
	})
}

// sendPrefill sends the prefill leg: built the first time, sent again as
// it was on a retry.
func (sp *laneSplit) sendPrefill(pd *lanePD, attempt int, anew bool) {
	lc := sp.lc
	if attempt > 0 && !anew {
		lc.leg.retried = false
		lc.leg.connect()
		return
	}
	p := lc.ll.ln.p
	lc.leg.prefill = true
	lc.leg.sentp, lc.leg.sent = p.Bufs.GetChunk()
	if len(p.PrefillStrip) > 0 { // --prefill-strip-headers: the prefill leg's own head
		lc.leg.sent = rawhttp.AppendLegStartStrip(lc.leg.sent, &lc.ll.req, p.PrefillStrip)
	} else {
		lc.leg.sent = append(lc.leg.sent, pd.start...)
	}
	body, scratch := pd.body, pd.scratch
	pd.scratch = nil // the leg holds it now (legTo)
	lc.leg.legTo(lc.r.Prefiller, body, scratch)
}

// rebuildPrefill builds the prefill leg's body again (without what the last
// attempt failed on: split.Action.Plain) for sendPrefill to send anew; the
// last attempt's buffers are given back. A body that cannot be built is
// the attempt's failure, fed to the machine.
func (sp *laneSplit) rebuildPrefill(pd *lanePD) bool {
	lc := sp.lc
	p := lc.ll.ln.p
	lc.leg.putSent()
	scratch, dst := p.Bufs.EditScratch(len(lc.r.Body))
	body, err := pd.seq.PrefillBody(dst)
	if err != nil {
		p.Bufs.PutScratch(scratch)
		sp.feedSplit(split.Event{Kind: split.PrefillFailed, Err: err})
		return false
	}
	pd.body, pd.scratch = body, scratch
	return true
}

// armSplit arms the split's timer t; it fires on the loop.
func (sp *laneSplit) armSplit(t split.Timer, d time.Duration) {
	lc := sp.lc
	fire := sp.fires[t]
	if fire == nil {
		fire = func() { sp.feedSplit(split.Event{Kind: split.TimerFired, Timer: t}) }
		sp.fires[t] = fire
	}
	switch t {
	case split.TimerPrefill:
		sp.prefillDue.start(d, fire)
	case split.TimerHedge:
		sp.hedgeDue.start(d, fire)
	case split.TimerBackoff:
		lc.state = laneBackoff
		lc.timer.startTimer(d, fire)
	}
}

// PrefillAnswered takes the prefill's answer, read whole.
func (sp *laneSplit) PrefillAnswered(a *rawhttp.Answer) {
	res, err := sp.pd.seq.PrefillAnswered(a.Status, a.Head.ContentType(), a.Buf)
	if err != nil {
		sp.prefillFailed(err)
		return
	}
	sp.pd.res = res
	sp.feedSplit(split.Event{Kind: split.PrefillAnswered, Handoff: res.Handoff})
}

// prefillFailed reports a failed prefill attempt.
func (sp *laneSplit) prefillFailed(err error) {
	lc := sp.lc
	lc.leg.head = lc.leg.head[:0]
	if lc.shadowOf != nil {
		lc.shadowOf.split.shadowFailed(lc, err)
		return
	}
	sp.feedSplit(split.Event{Kind: split.PrefillFailed, Err: err})
}

// serveLocal sends the request to the local engine, none prefilling it
// remotely, its body as the request features edit it.
func (lc *laneConn) serveLocal() {
	body, err := lc.r.EditLocal(lc.r.Body)
	if err != nil {
		lc.reply.failWith(fmt.Errorf("%w: %w", core.ErrBadRequest, err))
		return
	}
	lc.decodeLeg(body, nil, false)
}

// refused degrades a request whose named prefiller is refused to a local
// prefill with the client's body, or answers the error, as the split's
// rule says (split.Refused).
func (sp *laneSplit) refused(cause error) {
	lc := sp.lc
	r := lc.r
	for _, a := range split.Refused(lc.ll.ln.p.SplitConfig(), cause) {
		switch a.Op {
		case split.SendLocal:
			lc.decodeLeg(r.Body, nil, false)
		case split.Fail:
			lc.reply.failWith(a.Err)
		default:
			r.Account(a)
		}
	}
}

// remoteAnswered writes the decode leg's non-streamed answer, read whole,
// as relayJSON does: a KV load failure goes to the split.
func (sp *laneSplit) remoteAnswered(a *rawhttp.Answer) {
	lc := sp.lc
	r := lc.r
	if ps := sp.pd.paired; ps != nil {
		ps.answered(a)
		return
	}
	if err := r.KVAnswered(sp.pd.sent, a.Status); err != nil {
		sp.feedSplit(split.Event{Kind: split.LegFailed, Err: err})
		return
	}
	buf := r.AnswerBody(a.Status, a.Buf)
	r.JSONAnswered(a.Status)
	lc.reply.writeWhole(&a.Head, buf)
}

// gateStream holds the decode leg's stream back until its first output,
// and gives it the cached_tokens rewrite.
func (sp *laneSplit) gateStream(ls *relay.LoopStream) {
	lc := sp.lc
	r := lc.r
	ls.Rewrite = r.AnswerEdit()
	ls.Gate = sserelay.GateHolding
	if sp.gated == nil {
		sp.gated = sp.gateDone
	}
	ls.Gated = sp.gated
	if ps := sp.pd.paired; ps != nil {
		ls.Gated = ps.gated
	}
}

// gateDone decides on a held stream: relayed once its first output came;
// a KV load failure goes to the split; a stream that ended with no output
// is answered with the error.
func (sp *laneSplit) gateDone(g sserelay.Gate, held []byte) {
	lc := sp.lc
	r, ls := lc.r, lc.reply.ls
	lc.timer.stopTimer()
	if g == sserelay.GateHolding { // ended with no output
		lc.reply.dropStream()
		sp.feedSplit(split.Event{Kind: split.LegFailed, Err: core.EndedBefore(lc.r.Local, "any output", ls.Cut)})
		return
	}
	if err := r.KVStreamed(sp.pd.sent, g == sserelay.GateError); err != nil {
		lc.reply.dropStream()
		sp.feedSplit(split.Event{Kind: split.LegFailed, Err: err})
		return
	}
	lc.reply.relayHeld(held)
}

// endSplit frees the split's state once the request is over.
func (sp *laneSplit) endSplit() {
	lc := sp.lc
	pd := sp.pd
	if pd == nil {
		return
	}
	sp.pd = nil
	sp.prefillDue.stop()
	sp.hedgeDue.stop()
	bufs := &lc.ll.ln.p.Bufs
	bufs.PutScratch(pd.scratch)
	bufs.PutChunk(pd.bufp, pd.buf)
}

// endSplitEarly tells the split that the request ends before its answer
// began (the client left, the loop shuts down): the prefill's bookkeeping
// ends with cause, and the hedge is dropped.
func (sp *laneSplit) endSplitEarly(cause error) {
	switch pd := sp.pd; {
	case pd != nil && pd.first != nil:
		pd.first.exec(pd.first.m.On(split.Event{Kind: split.ClientGone, Err: cause}))
	case pd != nil && pd.paired != nil:
		pd.paired.exec(pd.paired.pm.On(split.Event{Kind: split.ClientGone, Err: cause}))
	case pd != nil && pd.m != nil:
		sp.execSplit(pd, pd.m.On(split.Event{Kind: split.ClientGone, Err: cause}))
	}
	sp.dropHedge()
}

// dropHedge ends the hedge's local leg, if any, before anything of it
// reached the client: its connection is closed.
func (sp *laneSplit) dropHedge() {
	pd := sp.pd
	if pd == nil || pd.hedge == nil {
		return
	}
	h := pd.hedge
	pd.hedge = nil
	h.timer.stopTimer()
	if h.reply.ls != nil {
		h.reply.dropStream()
	}
	h.leg.dropRaw()
	h.leg.endUp(false)
	h.leg.putSent()
	h.setGauge(nil)
	h.r, h.state = nil, laneGone
}

// decodeFirst returns the driver of the request's decode-first attempt
// while its leg is out or its answer held (nil: none).
func (sp *laneSplit) decodeFirst() *laneFirst {
	if sp.pd == nil || sp.pd.first == nil || !sp.pd.first.leg {
		return nil
	}
	return sp.pd.first
}

// pairedSplit returns the request's paired split's driver (nil: none).
func (sp *laneSplit) pairedSplit() *lanePaired {
	if sp.pd == nil {
		return nil
	}
	return sp.pd.paired
}

// shadowWhole takes a shadow's answer, read whole: a paired split's
// prefill leg's, or the hedge's local leg's.
func (sp *laneSplit) shadowWhole(h *laneConn, a *rawhttp.Answer) {
	if ps := sp.pairedSplit(); ps != nil && ps.pre == h {
		ps.prefillEnded(h, a, nil)
		return
	}
	sp.hedgeWhole(h, a)
}

// shadowFailed takes a shadow's failure: a paired split's prefill leg's,
// or the hedge's local leg's.
func (sp *laneSplit) shadowFailed(h *laneConn, err error) {
	if ps := sp.pairedSplit(); ps != nil && ps.pre == h {
		ps.prefillEnded(h, nil, err)
		return
	}
	sp.hedgeFailed(h, err)
}

// hedgeFailed reports the hedge's local leg h failing before it was ready.
func (sp *laneSplit) hedgeFailed(h *laneConn, err error) {
	if pd := sp.pd; pd != nil && pd.hedge == h {
		sp.feedSplit(split.Event{Kind: split.HedgeFailed, Err: err})
	}
}

// hedgeGated decides on the shadow's held stream: its first output came
// (the hedge is ready), or it ended or erred without one (it failed).
func (sp *laneSplit) hedgeGated(g sserelay.Gate, held []byte) {
	lc := sp.lc
	lc.timer.stopTimer()
	if g != sserelay.GateOutput {
		lc.shadowOf.split.hedgeFailed(lc, fmt.Errorf("%w: %w", core.ErrDecodeFailed, lc.reply.ls.EndedBefore("the local stream ended or erred before any output")))
		return
	}
	lc.shadowOf.split.hedgeReady(lc, held, nil)
}

// hedgeWhole takes the shadow's JSON answer, read whole: the hedge is
// ready.
func (sp *laneSplit) hedgeWhole(h *laneConn, a *rawhttp.Answer) { sp.hedgeReady(h, nil, a) }

// hedgeReady reports the hedge's local leg h ready: its stream's held
// bytes, or its JSON answer a, wait in the split for the machine's word.
func (sp *laneSplit) hedgeReady(h *laneConn, held []byte, a *rawhttp.Answer) {
	pd := sp.pd
	if pd == nil || pd.hedge != h {
		return
	}
	// Its bytes are the caller's only until it returns: the machine's
	// word on them comes now (a shadow's answer never arrives while the
	// primary's actions run).
	pd.readyHeld, pd.readyRaw = held, a
	sp.feedSplit(split.Event{Kind: split.HedgeReady})
	pd.readyHeld, pd.readyRaw = nil, nil
	if sp.pd == pd && pd.hedge == h { // not relayed: let go
		sp.dropHedge()
	}
}

// adoptHedge makes the hedge's local leg the request's answer: the
// primary takes over the shadow's leg, gauge and stream (held bytes on),
// or writes its JSON answer.
func (sp *laneSplit) adoptHedge(pd *lanePD) {
	lc := sp.lc
	r, h := lc.r, pd.hedge
	if h == nil {
		return
	}
	pd.hedge = nil
	lc.setGauge(nil)
	lc.gauge, h.gauge = h.gauge, nil
	h.timer.stopTimer()
	h.r, h.state = nil, laneGone
	if a := pd.readyRaw; a != nil {
		r.JSONAnswered(a.Status)
		lc.reply.writeWhole(&a.Head, r.LocalAnswerBody(a.Status, a.Buf))
		return
	}
	ls := h.reply.ls
	h.reply.ls = nil
	lc.leg.up, h.leg.up = h.leg.up, nil
	if u := lc.leg.up; u != nil {
		lc.ll.mu.Lock()
		u.owner = lc
		lc.ll.mu.Unlock()
	}
	lc.leg.addr, lc.state = h.leg.addr, laneAnswer
	lc.reply.streamed, h.reply.streamed = h.reply.streamed, false
	lc.reply.ls, ls.Conns, ls.Release = ls, lc, lc.finish
	lc.reply.relayHeld(pd.readyHeld)
}

// splitAnswers does a split machine's PassOn (a prefiller's rejection
// passed on, or the error answered) or Fail (the error answered, unless
// the request was dropped: nobody waits for it).
func (sp *laneSplit) splitAnswers(a split.Action) {
	lc := sp.lc
	r := lc.r
	switch a.Op {
	case split.PassOn:
		if rej := r.Rejection(a.Err); rej != nil {
			lc.reply.answerWhole(metrics.ModeDisaggregated, rej.Status, rej.ContentType, rej.Body)
			return
		}
		lc.reply.failWith(a.Err)
	case split.Fail:
		if r.Ctx.Err() == nil {
			lc.reply.failWith(a.Err)
		}
	}
}
