package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"time"
)

// watchConn reports a client leaving while its request is being served.
// fasthttp has no per-request cancellation (RequestCtx.Done fires only at
// server shutdown), so a goroutine blocks in a one-byte Read on the client
// connection: EOF or a reset means the client left, and cancel is called
// with ErrClientGone. The server does not read the connection while the
// handler and its body writer run, so nothing is taken from it, except the
// first byte of a pipelined next request, which ends the watch and closes
// the connection after the response (pipelining clients lose nothing but
// keep-alive). stop ends the watch and waits for the goroutine; it must run
// before the response is complete.
func watchConn(conn net.Conn, cancel context.CancelCauseFunc) (stop func() (pipelined bool)) {
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
