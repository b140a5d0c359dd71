//go:build linux

package clientconn

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// fdClosed reports whether the peer of socket fd closed or reset it: a
// peek finds the end of the stream, or the reset. A raw system call: it
// never blocks.
func fdClosed(fd int) bool {
	var b [1]byte
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e == 0 && n == 0 || e == unix.ECONNRESET
}
