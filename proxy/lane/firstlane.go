package lane

import (
	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/sserelay"
)

// The lane's driver of a decode-first attempt (split.DecodeFirst: the
// shared-storage connector with cache_hit_threshold), on the event loop.
// The client's body goes to the local engine first on the request's own
// connection; its answer is held, a stream until an event serves or
// declines the request (sserelay.GateDeciding), a JSON answer read whole,
// and the machine says what becomes of it: relayed as the request's
// answer, or dropped and the usual split run on the body the connector
// rewrites after a decline. The counts and logs are proxy/inference's, as
// fasthttp's driver has them done.

// firstState is a decode-first attempt's part of lanePD.
type firstState struct {
	m  *split.DecodeFirst
	df connectors.DecodeFirst
	// leg: the decode-first leg is out, or its answer is held.
	leg bool
	// The held answer while the machine decides on it (valid during that
	// feed only): a stream's bytes, or a JSON answer read whole.
	held  []byte
	whole *rawhttp.Answer
}

// splitDecodeFirst tries the request (beginSplit readied it) on the decode
// engine first, when the connector selects it; the usual split runs
// otherwise, or after a decline.
func (lc *laneConn) splitDecodeFirst() {
	r, p, pd := lc.r, lc.ll.ln.p, lc.pd
	df := p.Conn.(connectors.DecodeFirst)
	fs := &firstState{m: split.NewDecodeFirst(), df: df}
	pd.first, pd.triedFirst = fs, true
	pd.feeding = true
	lc.execFirst(pd, fs.m.Start(df.TryDecodeFirst(r.API, r.Body)))
	lc.drainSplit(pd)
}

// execFirst executes the decode-first machine's actions for the split pd.
func (lc *laneConn) execFirst(pd *lanePD, acts []split.Action) {
	r, fs := lc.r, pd.first
	for _, a := range acts {
		if a.Op == split.DecodeFirstCounted {
			r.AccountDecodeFirst(a) // counted even when the relay before it ended the request
			continue
		}
		if lc.pd != pd {
			return // the request ended meanwhile
		}
		switch a.Op {
		case split.SendDecodeFirst:
			fs.leg = true
			lc.firstLeg()
		case split.DropDecodeFirst:
			lc.dropFirst(fs)
		case split.RelayDecodeFirst:
			lc.relayFirst(fs)
		case split.BuildAfterDecline:
			body, err := fs.df.AfterDecline(nil, r.API, r.Body)
			if err != nil {
				lc.feedSplit(split.Event{Kind: split.AfterDeclineFailed, Err: err})
				continue
			}
			r.Body = body
			lc.feedSplit(split.Event{Kind: split.AfterDeclineBuilt})
		case split.RunSplit:
			r.AccountDecodeFirst(a)
			pd.first = nil
			lc.split()
		case split.Fail:
			lc.splitAnswers(a)
		}
	}
}

// firstLeg sends the client's body to the local engine: the decode-first
// leg, its answer read up to where it serves or declines the request.
func (lc *laneConn) firstLeg() {
	ll, r, p := lc.ll, lc.r, lc.ll.ln.p
	lc.setGauge(ll.local)
	lc.sentp, lc.sent = p.Bufs.GetChunk()
	lc.sent = append(lc.sent, lc.pd.start...)
	if r.Stream && p.Cfg.DecodeFirstByteTimeout > 0 {
		lc.startTimer(p.Cfg.DecodeFirstByteTimeout, lc.firstByteTimeout)
	}
	lc.prefill = false
	lc.legTo(r.Local, r.Body, nil)
}

// firstOut reports whether the request's decode-first leg is out, or its
// answer held.
func (lc *laneConn) firstOut() bool {
	return lc.pd != nil && lc.pd.first != nil && lc.pd.first.leg
}

// gateFirst holds the decode-first leg's stream until an event serves or
// declines the request.
func (lc *laneConn) gateFirst(ls *relay.LoopStream) {
	r, fs := lc.r, lc.pd.first
	ls.Gate, ls.Gated = sserelay.GateDeciding, lc.firstGated
	ls.Declines = func(d []byte) bool { return fs.df.Declined(r.API, d) }
}

// firstGated decides on the decode-first leg's held stream: an event
// served the request (or it ended cleanly after some events: what came is
// relayed), declined it, or it ended or broke with none.
func (lc *laneConn) firstGated(g sserelay.Gate, held []byte) {
	r, ls, pd := lc.r, lc.ls, lc.pd
	lc.stopTimer()
	switch {
	case g == sserelay.GateDeclined:
		lc.feedSplit(split.Event{Kind: split.FirstAnswerDeclined})
	case g == sserelay.GateOutput || (g == sserelay.GateDeciding && ls.SawEvents() && ls.UpErr == nil):
		pd.first.held = held
		lc.feedSplit(split.Event{Kind: split.FirstAnswerReady})
		if lc.pd == pd && pd.first != nil {
			pd.first.held = nil
		}
	default:
		lc.dropFirst(pd.first)
		cause := ls.UpErr
		if cause == nil {
			cause = inference.EndedEarly(r.Local, "any event", ls.Cut)
		}
		lc.feedSplit(split.Event{Kind: split.FirstLegFailed, Err: inference.BeforeOutputErr(cause)})
	}
}

// firstAnswered takes the decode-first leg's JSON answer, read whole.
func (lc *laneConn) firstAnswered(a *rawhttp.Answer) {
	r, pd := lc.r, lc.pd
	fs := pd.first
	if a.Status == 200 && fs.df.Declined(r.API, a.Buf) {
		fs.leg = false
		lc.feedSplit(split.Event{Kind: split.FirstAnswerDeclined})
		return
	}
	fs.whole = a
	lc.feedSplit(split.Event{Kind: split.FirstAnswerReady})
	if lc.pd == pd && pd.first != nil {
		pd.first.whole = nil
	}
}

// firstFailed reports the decode-first leg failing before any output
// (false: the request has no decode-first leg out).
func (lc *laneConn) firstFailed(err error) bool {
	if !lc.firstOut() {
		return false
	}
	lc.pd.first.leg = false
	lc.feedSplit(split.Event{Kind: split.FirstLegFailed, Err: inference.BeforeOutputErr(err)})
	return true
}

// dropFirst lets go of the decode-first leg, or its held answer, which the
// client never saw: its connection is closed, so the engine aborts it.
func (lc *laneConn) dropFirst(fs *firstState) {
	if !fs.leg {
		return
	}
	fs.leg = false
	lc.dials++ // a dial on its way is let go
	lc.stopTimer()
	if lc.ls != nil {
		lc.dropStream()
	}
	lc.dropRaw()
	lc.endUp(false)
	lc.putSent()
	lc.setGauge(nil)
	lc.state = laneSending
}

// relayFirst makes the decode engine's held answer the request's.
func (lc *laneConn) relayFirst(fs *firstState) {
	r := lc.r
	fs.leg = false
	if a := fs.whole; a != nil {
		r.DecodeFirstAnswered(a.Status, false)
		lc.writeWhole(&a.Head, a.Buf)
		return
	}
	ls := lc.ls
	r.DecodeFirstAnswered(r.Obs.Status, true)
	ls.MarkOutput()
	lc.FirstOutput()
	ls.Write(fs.held)
}
