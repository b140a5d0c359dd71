package proxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// The lane's hedged prefill (hedge.go says what and why). The local leg
// runs on a shadow laneConn: the request's, on the same loop, with the
// client's descriptor but never writing to it, sharing its primary's lock
// (laneConn.lock). It is the plain local leg (decodeLeg), its stream held
// until its first output (gateHolding), a JSON answer read whole. Whichever
// is ready first wins: the prefill's answer drops the shadow (its
// connection closed, so the engine aborts the request); the shadow's
// readiness cancels the prefill (its connection closed) and the primary
// adopts the shadow's stream, connection and gauge, and relays from the
// held bytes on, as a local stream that began.

// errHedgeAbandoned: a hedge's local leg ended by the sidecar (the loop
// shutting down).
var errHedgeAbandoned = errors.New("hedge's local leg abandoned")

// startHedge arms the hedge point of the prefill just sent, when the
// request may be hedged.
func (lc *laneConn) startHedge() {
	p, r, pd := lc.ll.ln.p, lc.r, lc.pd
	after, ok := p.hedge.split(r.label)
	if !ok || !p.hedgeable() {
		return
	}
	pd.hedgeAfter = after
	pd.hedgeTimer = time.AfterFunc(after, func() { lc.onLoop(r, lc.hedgeDue) })
}

// hedgeDue starts the local leg at the hedge point, if the prefill still
// runs and the budget allows.
func (lc *laneConn) hedgeDue() {
	pd := lc.pd
	if pd == nil || !lc.prefill || pd.hedge != nil || !lc.ll.ln.p.hedge.take() {
		return
	}
	h := &laneConn{ll: lc.ll, cc: lc.cc, fd: lc.fd, keepAlive: lc.keepAlive, r: lc.r, pd: pd, shadowOf: lc}
	pd.hedge, pd.hedgeAt = h, time.Now()
	h.decodeLeg(lc.r.body, nil, false)
}

// stopHedgeTimer disarms the hedge point (the prefill ended).
func (pd *lanePD) stopHedgeTimer() {
	if pd.hedgeTimer != nil {
		pd.hedgeTimer.Stop()
		pd.hedgeTimer = nil
	}
}

// hedgeSettled is called when the prefill ended with err while a hedge
// runs; it reports true when the request now waits for the hedge: the
// prefill failed in a way that degrades to a local prefill, which the
// hedge already is. Otherwise the hedge is dropped (the prefill won, or
// its failure is answered).
func (lc *laneConn) hedgeSettled(err error) bool {
	pd := lc.pd
	if pd == nil || pd.hedge == nil {
		return false
	}
	var rej *rejected
	if err != nil && !errors.As(err, &rej) && lc.r.degrade(err) {
		pd.awaitHedge = true
		return true
	}
	lc.dropHedge()
	if err == nil {
		lc.ll.ln.p.hedge.won(metrics.HedgeRemote, time.Since(pd.hedgeAt))
		lc.r.logAt(zerolog.InfoLevel).Dur("hedge_after", pd.hedgeAfter).Msg("hedge: the prefill answered first; local prefill cancelled")
	}
	return false
}

// dropHedge ends the hedge's local leg, if any, before anything of it
// reached the client: its connection is closed.
func (lc *laneConn) dropHedge() {
	pd := lc.pd
	if pd == nil {
		return
	}
	pd.stopHedgeTimer()
	h := pd.hedge
	if h == nil {
		return
	}
	pd.hedge = nil
	h.stopTimer()
	if h.ls != nil {
		h.dropStream()
	}
	h.dropRaw()
	h.endUp(false)
	h.putSent()
	h.setGauge(nil)
	h.r, h.state = nil, laneGone
}

// hedgeFailed handles the hedge's local leg failing before it was ready:
// the prefill goes on alone, or, when the request was waiting for the
// hedge as its fallback, the failure is answered.
func (lc *laneConn) hedgeFailed(h *laneConn, err error) {
	pd := lc.pd
	if pd == nil || pd.hedge != h {
		return
	}
	lc.dropHedge()
	if pd.awaitHedge {
		lc.failWith(err)
		return
	}
	lc.r.logAt(zerolog.WarnLevel).Err(err).Msg("hedge: local prefill failed; waiting for the prefill")
}

// hedgeGated decides on the shadow's held stream: its first output came
// (the hedge wins), or it ended or erred without one (the hedge failed).
func (lc *laneConn) hedgeGated(g gateState, held []byte) {
	lc.stopTimer()
	if g != gateOutput {
		lc.shadowOf.hedgeFailed(lc, fmt.Errorf("%w: %w", ErrDecodeFailed, lc.ls.endedBefore("the local stream ended or erred before any output")))
		return
	}
	lc.shadowOf.hedgeWon(lc, held, nil)
}

// hedgeWhole takes the shadow's JSON answer, read whole: the hedge wins.
func (lc *laneConn) hedgeWhole(h *laneConn, a *rawAnswer) {
	lc.hedgeWon(h, nil, a)
}

// hedgeWon answers the request with the hedge's local leg, ready first:
// the prefill (unless it already failed) is cancelled, and the shadow's
// stream (held bytes on) or JSON answer a becomes the request's answer.
func (lc *laneConn) hedgeWon(h *laneConn, held []byte, a *rawAnswer) {
	r, p, pd := lc.r, lc.ll.ln.p, lc.pd
	if pd == nil || pd.hedge != h {
		return
	}
	pd.hedge = nil
	pd.stopHedgeTimer()
	if lc.prefill {
		// The prefill is cancelled: its connection closed, so the
		// prefiller drops the request and frees its work.
		lc.stopTimer()
		lc.endUp(false)
		lc.dropRaw()
		lc.putSent()
		lc.endPrefill(errHedgeLost)
		p.m.Fallbacks.WithLabelValues(ReasonSlowPrefill).Inc()
		r.obs.reason, r.mode = ReasonSlowPrefill, metrics.ModeFallback
		r.logAt(zerolog.WarnLevel).Dur("hedge_after", pd.hedgeAfter).Str("reason", ReasonSlowPrefill).
			Msg("hedge: the local prefill was ready first; prefill cancelled, answered locally")
	}
	p.hedge.won(metrics.HedgeLocal, time.Since(pd.hedgeAt)+pd.hedgeAfter)
	// The primary takes over the shadow's leg, gauge and stream.
	lc.setGauge(nil)
	lc.gauge, h.gauge = h.gauge, nil
	h.stopTimer()
	h.r, h.state = nil, laneGone
	if a != nil {
		r.jsonAnswered(a.status)
		lc.writeWhole(&a.head, a.buf)
		return
	}
	ls := h.ls
	h.ls = nil
	lc.up, h.up = h.up, nil
	if u := lc.up; u != nil {
		lc.ll.mu.Lock()
		u.owner = lc
		lc.ll.mu.Unlock()
	}
	lc.addr, lc.state = h.addr, laneAnswer
	lc.streamed, h.streamed = h.streamed, false
	lc.ls, ls.conns, ls.release = ls, lc, lc.finish
	r.p.m.Requests.WithLabelValues(r.mode, statusLabel(r.obs.status)).Inc()
	ls.ttftSeen = true
	lc.firstOutput()
	ls.write(held)
}
