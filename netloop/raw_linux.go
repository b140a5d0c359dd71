//go:build linux

package netloop

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The loops' system calls never block (non-blocking sockets, epoll_wait
// with a zero timeout, epoll_ctl), so they are made as raw system calls:
// without the runtime's entersyscall/exitsyscall, which would hand the
// processor off for a call that returns at once, and which wakes the
// runtime's sysmon thread from its idle sleep on every call after the
// process was idle — on a lightly loaded sidecar, a thread wake-up and its
// 20 µs polling for every request.

func errnoErr(e syscall.Errno) error {
	switch e {
	case 0:
		return nil
	case unix.EAGAIN:
		return unix.EAGAIN
	case unix.EINTR:
		return unix.EINTR
	}
	return e
}

// rawRead is read(2) of p on fd (writes go through rawWritev).
func rawRead(fd int, p []byte) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(ptr), uintptr(len(p)))
	if e != 0 {
		return 0, errnoErr(e)
	}
	return int(n), nil
}

// rawEpollPoll collects the ready events of epfd without waiting.
func rawEpollPoll(epfd int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])),
		uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, errnoErr(e)
	}
	return int(n), nil
}

func rawEpollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd),
		uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return errnoErr(e)
	}
	return nil
}

// rawWritev is writev(2) of a and b (either may be empty) on fd.
func rawWritev(fd int, a, b []byte) (int, error) {
	var iov [2]unix.Iovec
	n := 0
	for _, p := range [2][]byte{a, b} {
		if len(p) > 0 {
			iov[n].Base = &p[0]
			iov[n].SetLen(len(p))
			n++
		}
	}
	if n == 0 {
		return 0, nil
	}
	w, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
	if e != 0 {
		return 0, errnoErr(e)
	}
	return int(w), nil
}

// rawSetRcvLowat sets fd's SO_RCVLOWAT to n.
func rawSetRcvLowat(fd, n int) error {
	v := int32(n)
	_, _, e := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT,
		uintptr(unsafe.Pointer(&v)), 4, 0)
	if e != 0 {
		return errnoErr(e)
	}
	return nil
}
