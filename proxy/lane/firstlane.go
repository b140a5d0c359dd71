package lane

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
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

// laneFirst is the lane's driver of one request's decode-first attempt:
// lanePD's part while it runs.
type laneFirst struct {
	lc *laneConn
	pd *lanePD
	m  *split.DecodeFirst
	df core.DecodeFirst // the request's side of the attempt
	// leg: the decode-first leg is out, or its answer is held.
	leg bool
	// The held answer while the machine decides on it (valid during that
	// feed only): a stream's bytes, or a JSON answer read whole.
	held  []byte
	whole *rawhttp.Answer
}

// runDecodeFirst tries lc's request (beginSplit readied it) on the decode
// engine first, when the connector selects it; the usual split runs
// otherwise, or after a decline.
func runDecodeFirst(lc *laneConn) {
	pd := lc.split.pd
	fs := &laneFirst{lc: lc, pd: pd, m: split.NewDecodeFirst(), df: core.BeginDecodeFirst(lc.r)}
	pd.first, pd.triedFirst = fs, true
	pd.feeding = true
	fs.exec(fs.m.Start(fs.df.Try()))
	lc.split.drainSplit(pd)
}

// exec executes the machine's actions.
func (fs *laneFirst) exec(acts []split.Action) {
	lc, pd := fs.lc, fs.pd
	for _, a := range acts {
		if a.Op == split.DecodeFirstCounted {
			fs.df.Account(a) // counted even when the relay before it ended the request
			continue
		}
		if lc.split.pd != pd {
			return // the request ended meanwhile
		}
		switch a.Op {
		case split.SendDecodeFirst:
			fs.leg = true
			fs.send()
		case split.DropDecodeFirst:
			fs.drop()
		case split.RelayDecodeFirst:
			fs.relay()
		case split.BuildAfterDecline:
			if err := fs.df.AfterDecline(); err != nil {
				lc.split.feedSplit(split.Event{Kind: split.AfterDeclineFailed, Err: err})
				continue
			}
			lc.split.feedSplit(split.Event{Kind: split.AfterDeclineBuilt})
		case split.RunSplit:
			fs.df.Account(a)
			pd.first = nil
			lc.split.run()
		case split.Fail:
			lc.split.splitAnswers(a)
		}
	}
}

// send sends the client's body to the local engine: the decode-first leg,
// its answer read up to where it serves or declines the request.
func (fs *laneFirst) send() {
	lc := fs.lc
	ll, r, p := lc.ll, lc.r, lc.ll.ln.p
	lc.setGauge(ll.local)
	lc.leg.sentp, lc.leg.sent = p.Bufs.GetChunk()
	lc.leg.sent = append(lc.leg.sent, lc.split.pd.start...)
	lc.timer.boundFirstByte()
	lc.leg.prefill = false
	lc.leg.legTo(r.Local, r.Body, nil)
}

// gate holds the decode-first leg's stream until an event serves or
// declines the request.
func (fs *laneFirst) gate(ls *relay.LoopStream) {
	ls.Gate, ls.Gated = sserelay.GateDeciding, fs.gated
	ls.Declines = fs.df.EventDeclines
}

// gated decides on the decode-first leg's held stream: an event served
// the request (or it ended cleanly after some events: what came is
// relayed), declined it, or it ended or broke with none.
func (fs *laneFirst) gated(g sserelay.Gate, held []byte) {
	lc := fs.lc
	r, ls := lc.r, lc.reply.ls
	lc.timer.stopTimer()
	switch {
	case g == sserelay.GateDeclined:
		lc.split.feedSplit(split.Event{Kind: split.FirstAnswerDeclined})
	case g == sserelay.GateOutput || (g == sserelay.GateDeciding && ls.SawEvents() && ls.UpErr == nil):
		fs.held = held
		lc.split.feedSplit(split.Event{Kind: split.FirstAnswerReady})
		fs.held = nil
	default:
		fs.drop()
		cause := ls.UpErr
		if cause == nil {
			cause = core.EndedEarly(r.Local, "any event", ls.Cut)
		}
		lc.split.feedSplit(split.Event{Kind: split.FirstLegFailed, Err: core.BeforeOutputErr(cause)})
	}
}

// answered takes the decode-first leg's JSON answer, read whole.
func (fs *laneFirst) answered(a *rawhttp.Answer) {
	lc := fs.lc
	if fs.df.AnswerDeclines(a.Status, a.Buf) {
		fs.leg = false
		lc.split.feedSplit(split.Event{Kind: split.FirstAnswerDeclined})
		return
	}
	fs.whole = a
	lc.split.feedSplit(split.Event{Kind: split.FirstAnswerReady})
	fs.whole = nil
}

// failed reports the decode-first leg failing before any output (false:
// no decode-first leg is out, fs nil included).
func (fs *laneFirst) failed(err error) bool {
	if fs == nil || !fs.leg {
		return false
	}
	fs.leg = false
	fs.lc.split.feedSplit(split.Event{Kind: split.FirstLegFailed, Err: core.BeforeOutputErr(err)})
	return true
}

// drop lets go of the decode-first leg, or its held answer, which the
// client never saw: its connection is closed, so the engine aborts it.
func (fs *laneFirst) drop() {
	lc := fs.lc
	if !fs.leg {
		return
	}
	fs.leg = false
	lc.leg.dropLeg()
	lc.setGauge(nil)
}

// relay makes the decode engine's held answer the request's.
func (fs *laneFirst) relay() {
	lc := fs.lc
	r := lc.r
	fs.leg = false
	if a := fs.whole; a != nil {
		fs.df.Answered(a.Status, false)
		lc.reply.writeWhole(&a.Head, r.LocalAnswerBody(a.Status, a.Buf))
		return
	}
	ls := lc.reply.ls
	fs.df.Answered(r.Obs.Status, true)
	ls.MarkOutput()
	lc.reply.firstOutput()
	ls.Write(fs.held)
}
