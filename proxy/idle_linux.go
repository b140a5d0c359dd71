//go:build linux

package proxy

import (
	"crypto/tls"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// idleQuiet reports whether a pooled connection is fit to carry a request:
// the upstream neither sent anything (no request of ours is outstanding, so
// it would be an answer to a request never sent) nor closed it. It peeks
// without blocking or consuming.
func idleQuiet(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	quiet := false
	if err := rc.Control(func(fd uintptr) { quiet = fdQuiet(int(fd)) }); err != nil {
		return false
	}
	return quiet
}

// fdQuiet is idleQuiet of a socket: nothing to read, and not closed by the
// peer (not a socket: nothing to tell). A raw system call: it never blocks
// (see netloop/raw_linux.go).
func fdQuiet(fd int) bool {
	var b [1]byte
	_, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e == unix.EAGAIN || e == unix.ENOTSOCK
}

// fdClosed reports whether the peer of socket fd closed or reset it: a
// peek finds the end of the stream, or the reset. A raw system call: it
// never blocks.
func fdClosed(fd int) bool {
	var b [1]byte
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e == 0 && n == 0 || e == unix.ECONNRESET
}
