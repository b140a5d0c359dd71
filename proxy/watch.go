package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// watchDelay is how long a request waits on its upstream before its client
// connection is watched. An answer that begins sooner never pays for the
// watch (a goroutine and a read per request); a client leaving during a
// longer wait (a prefill, a queued decode) is noticed at most watchDelay
// late, which no engine notices: none finishes a prefill that fast.
const watchDelay = 10 * time.Millisecond

// connWatch reports a client leaving while its request waits on an
// upstream. fasthttp has no per-request cancellation (RequestCtx.Done fires
// only at server shutdown), so once armed a goroutine blocks in a one-byte
// Read on the client connection: EOF or a reset means the client left, and
// cancel is called with ErrClientGone. The server does not read the
// connection while the handler and its body writer run, so nothing is taken
// from it, except the first byte of a pipelined next request, which ends
// the watch and closes the connection after the response (pipelining
// clients lose nothing but keep-alive).
//
// The watch ends when stop is called: before the response is complete, and
// as soon as an answer starts streaming, from which point a client that
// left fails the next write instead (so an open stream holds no watcher).
type connWatch struct {
	conn   net.Conn
	cancel context.CancelCauseFunc
	timer  *time.Timer

	mu        sync.Mutex
	stopped   bool
	pipelined bool
	end       func() bool // stops the running watcher; nil: none started
}

// watchConn arms a watch of conn after watchDelay.
func watchConn(conn net.Conn, cancel context.CancelCauseFunc) *connWatch {
	return watchConnAfter(conn, cancel, watchDelay)
}

func watchConnAfter(conn net.Conn, cancel context.CancelCauseFunc, delay time.Duration) *connWatch {
	w := &connWatch{conn: conn, cancel: cancel}
	w.timer = time.AfterFunc(delay, w.start)
	return w
}

func (w *connWatch) start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.end = readWatch(w.conn, w.cancel)
	}
}

// stop ends the watch (it may be called more than once) and reports whether
// the watcher took the first byte of a pipelined request, in which case the
// connection must close after this response.
func (w *connWatch) stop() (pipelined bool) {
	if w.timer.Stop() {
		return false // never armed
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.stopped = true
		if w.end != nil {
			w.pipelined = w.end()
		}
	}
	return w.pipelined
}

// readWatch runs the watcher goroutine; the returned func stops it and
// waits for it.
func readWatch(conn net.Conn, cancel context.CancelCauseFunc) (stop func() (pipelined bool)) {
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
			cancel(ErrClientGone)
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
