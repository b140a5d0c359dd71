//go:build linux

package upstream

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
	if err := rc.Control(func(fd uintptr) { quiet = FdQuiet(int(fd)) }); err != nil {
		return false
	}
	return quiet
}

// FdQuiet is idleQuiet of socket fd: nothing to read, and not closed by
// the peer (not a socket: nothing to tell). A raw system call, as the event
// loops' are: it never blocks.
func FdQuiet(fd int) bool {
	var b [1]byte
	_, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e == unix.EAGAIN || e == unix.ENOTSOCK
}
