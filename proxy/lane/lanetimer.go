package lane

import (
	"time"

	"github.com/pd-sidecar/pd-sidecar/proxy/core"
)

// loopTimer runs a function on its connection's loop after a while, for
// the request the connection carried when it was started. It keeps one
// time.Timer, made at its first start and re-armed by every later one,
// so that arming it costs a request no allocation. A firing that reaches
// the loop after the timer was stopped, or before what it was re-armed
// for is due (a firing of an earlier arming, already on its way), does
// nothing.
type loopTimer struct {
	lc  *laneConn // set with the connection, before any start
	t   *time.Timer
	run func() // onLoop, made once
	// What the armed timer runs, for which request, and when: set and
	// read on the loop, under the connection's lock.
	f   func()
	r   *core.Request
	due time.Time
}

// start runs f on the loop after d, unless stop (or another start) comes
// first.
func (lt *loopTimer) start(d time.Duration, f func()) {
	lt.f, lt.r = f, lt.lc.r
	lt.due = time.Now().Add(d) // the timer's expiry is no earlier
	if lt.t == nil {
		lt.run = lt.onLoop
		lt.t = time.AfterFunc(d, lt.fire)
		return
	}
	lt.t.Reset(d)
}

// stop stops the timer; a firing already on its way does nothing.
func (lt *loopTimer) stop() {
	if lt.f == nil {
		return
	}
	lt.f, lt.r = nil, nil
	lt.t.Stop()
}

// fire is the timer's function: it runs off the loop, so it only hands
// the firing to the loop.
func (lt *loopTimer) fire() { lt.lc.ll.loop.Post(lt.run) }

// onLoop runs the armed function, if the firing is its.
func (lt *loopTimer) onLoop() {
	mu := lt.lc.lock()
	mu.Lock()
	defer mu.Unlock()
	f := lt.f
	if f == nil || lt.r != lt.lc.r || time.Now().Before(lt.due) {
		return
	}
	lt.f, lt.r = nil, nil
	f()
}

// laneTimer is a connection's timer: the decode leg's head timeout, the
// prefill's backoff, or a body's read deadline; it fires on the loop.
type laneTimer struct {
	loopTimer
	firstByte func() // firstByteTimeout, made once
}

// startTimer runs f on the loop after d, unless stopTimer (or another
// startTimer) comes first.
func (tm *laneTimer) startTimer(d time.Duration, f func()) { tm.start(d, f) }

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
		if tm.firstByte == nil {
			tm.firstByte = tm.firstByteTimeout
		}
		tm.startTimer(d, tm.firstByte)
	}
}

// stopTimer stops the timer; one already on its way to the loop does
// nothing there.
func (tm *laneTimer) stopTimer() { tm.stop() }
