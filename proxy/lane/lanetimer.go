package lane

import "time"

// laneTimer is a connection's timer: the decode leg's head timeout, the
// prefill's backoff, or a body's read deadline; it fires on the loop.
type laneTimer struct {
	lc       *laneConn
	timer    *time.Timer
	timerGen uint64 // startTimer's, so that a timer stopped on its way to the loop does nothing
}

// startTimer runs f on the loop after d, unless stopTimer (or another
// startTimer) comes first.
func (tm *laneTimer) startTimer(d time.Duration, f func()) {
	lc := tm.lc
	tm.stopTimer()
	gen, r := tm.timerGen, lc.r
	tm.timer = time.AfterFunc(d, func() {
		lc.onLoop(r, func() {
			if tm.timerGen == gen { // not stopped while f was on its way to the loop
				tm.timer = nil
				f()
			}
		})
	})
}

// firstByteTimeout fails a streamed request whose answer did not begin
// (no head, or a stream still held back) within --decode-first-byte-timeout.
func (tm *laneTimer) firstByteTimeout() {
	lc := tm.lc
	switch {
	case lc.state == laneWaiting || lc.state == laneSending:
		lc.leg.endUp(false)
	case lc.state == laneAnswer && lc.reply.ls != nil && lc.reply.ls.Gate.Shut():
		lc.reply.dropStream()
	default:
		return
	}
	lc.failed(lc.r.FirstByteTimedOut())
}

// boundFirstByte bounds the wait for the beginning of the leg's answer as
// the request says (Request.FirstByteBound).
func (tm *laneTimer) boundFirstByte() {
	lc := tm.lc
	if d := lc.r.FirstByteBound(); d > 0 {
		tm.startTimer(d, tm.firstByteTimeout)
	}
}

// stopTimer stops the timer; one already on its way to the loop does
// nothing there.
func (tm *laneTimer) stopTimer() {
	tm.timerGen++
	if tm.timer != nil {
		tm.timer.Stop()
		tm.timer = nil
	}
}
