// Package netloop runs event loops: a few goroutines, each waiting on the
// readiness of many connections at once (epoll on Linux), so that a
// connection with nothing to do holds no goroutine, no stack and no buffer.
// A Handler reacts to its connection's readiness on the loop's goroutine
// and does its I/O with the non-blocking Read and Write of this package.
//
// The connections stay Go net.Conns, owned by their callers: a loop only
// watches their file descriptors, and a caller takes one back with Remove
// before using it again through the net.Conn (or closing it).
package netloop

import (
	"errors"
	"net"
	"syscall"
)

// Events is a set of readiness events.
type Events uint32

// The events a Handler is told of. Readable and Writable are asked for;
// HangUp (the peer closed or reset the connection) always reported, and
// Shutdown is the loop's own: it is closing, and the handler must let go
// of its connection.
const (
	Readable Events = 1 << iota
	Writable
	HangUp
	Shutdown
)

// Handler is told its connection's events, on the loop's goroutine (one
// call at a time per loop). It must not block.
type Handler interface {
	Ready(fd int, ev Events)
}

// ErrUnsupported: this platform has no event loop (the caller keeps its
// goroutine per connection).
var ErrUnsupported = errors.New("netloop: not supported on this platform")

// ErrClosed: the loop was closed.
var ErrClosed = errors.New("netloop: loop closed")

// ErrWouldBlock: the non-blocking Read or Write would have to wait.
var ErrWouldBlock = errors.New("netloop: would block")

// FD returns c's file descriptor when c is a plain socket (TCP or Unix),
// the only kind a loop can watch. It stays c's: valid until c is closed.
func FD(c net.Conn) (int, bool) {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return 0, false
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	fd := -1
	if rc.Control(func(f uintptr) { fd = int(f) }) != nil || fd < 0 {
		return 0, false
	}
	return fd, true
}
