package clientconn

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// WatchDelay is how long a request waits on its upstream before its client
// connection is watched. An answer that begins sooner never pays for the
// watch (a goroutine and a read per request); a client leaving during a
// longer wait (a prefill, a queued decode) is noticed at most WatchDelay
// late, which no engine notices: none finishes a prefill that fast.
const WatchDelay = 10 * time.Millisecond

// Watch reports a client leaving while its request waits on an upstream.
// fasthttp has no per-request cancellation (RequestCtx.Done fires only at
// server shutdown), so once armed a goroutine blocks in a one-byte Read on
// the client connection: EOF or a reset means the client left, and cancel
// is called with its Armer's cause. The server does not read the
// connection while the handler and its body writer run, so nothing is taken
// from it, except the first byte of a pipelined next request, which ends
// the watch and closes the connection after the response: the pipelining
// client sends that request again, as it must for any request a closed
// connection left unanswered.
//
// The watch ends when Stop is called: before the response is complete, and
// as soon as an answer starts streaming, from which point a client that
// left fails the next write instead (so an open stream holds no watcher).
type Watch struct {
	conn   net.Conn
	cancel context.CancelCauseFunc
	since  time.Time // when the request began waiting

	mu        sync.Mutex
	stopped   bool
	pipelined bool
	end       func() bool // stops the running watcher; nil: none started
}

// arm starts the watcher unless the watch was stopped; a client that left
// cancels with gone.
func (w *Watch) arm(gone error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped && w.end == nil {
		w.end = readWatch(w.conn, w.cancel, gone)
	}
}

// done reports whether the watch was stopped.
func (w *Watch) done() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

// Stop ends the watch (it may be called more than once) and reports whether
// the watcher took the first byte of a pipelined request, in which case the
// connection must close after this response.
func (w *Watch) Stop() (pipelined bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.stopped = true
		if w.end != nil {
			w.pipelined = w.end()
			w.end = nil
		}
	}
	return w.pipelined
}

// Armer arms the watches of requests that have waited its delay. One
// timer serves every request (a timer per request would cost an allocation
// and, on a quiet proxy, a wake-up of the network poller per request): it
// runs only while watches are queued, and fires when the oldest is due.
// Watches are queued in the order their requests began, so the due ones are
// always at the front; stopped ones are dropped as the front passes them.
type Armer struct {
	delay time.Duration
	gone  error // the cause a client that left cancels its request with

	mu      sync.Mutex
	queue   []*Watch
	timer   *time.Timer
	pending bool // the timer is set
}

// NewArmer returns an Armer that arms a watch once its request has waited
// delay; a client that left cancels its request with gone.
func NewArmer(delay time.Duration, gone error) *Armer {
	a := &Armer{delay: delay, gone: gone}
	a.timer = time.AfterFunc(time.Hour, a.fire)
	a.timer.Stop()
	return a
}

// Watch queues a watch of conn for a request that began waiting at since;
// cancel is the request's.
func (a *Armer) Watch(conn net.Conn, cancel context.CancelCauseFunc, since time.Time) *Watch {
	w := &Watch{conn: conn, cancel: cancel, since: since}
	a.mu.Lock()
	a.queue = append(a.queue, w)
	if !a.pending {
		a.pending = true
		a.timer.Reset(a.delay)
	}
	a.mu.Unlock()
	return w
}

// fire arms the watches that are due and sets the timer for the next.
func (a *Armer) fire() {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	i := 0
	for ; i < len(a.queue); i++ {
		w := a.queue[i]
		if w.done() {
			continue
		}
		if wait := w.since.Add(a.delay).Sub(now); wait > 0 {
			break
		}
		w.arm(a.gone)
	}
	n := copy(a.queue, a.queue[i:])
	clear(a.queue[n:])
	a.queue = a.queue[:n]
	if n == 0 {
		a.pending = false
		return
	}
	a.timer.Reset(max(a.queue[0].since.Add(a.delay).Sub(now), time.Millisecond))
}

// readWatch runs the watcher goroutine, which cancels with gone when the
// client left; the returned func stops it and waits for it.
func readWatch(conn net.Conn, cancel context.CancelCauseFunc, gone error) (stop func() (pipelined bool)) {
	done := make(chan bool, 1)
	stopping := make(chan struct{})
	go func() {
		var b [1]byte
		for {
			n, err := conn.Read(b[:])
			if n > 0 {
				done <- true
				return
			}
			select {
			case <-stopping:
				done <- false
				return
			default:
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// A deadline someone else set; keep watching.
				_ = conn.SetReadDeadline(time.Time{})
				continue
			}
			cancel(gone)
			done <- false
			return
		}
	}()
	return func() bool {
		close(stopping)
		_ = conn.SetReadDeadline(time.Unix(1, 0))
		pipelined := <-done
		_ = conn.SetReadDeadline(time.Time{})
		return pipelined
	}
}
