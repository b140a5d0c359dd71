package clientconn

import (
	"crypto/tls"
	"net"
	"syscall"
)

// PeerClosed reports whether the peer of c has closed its side (a FIN or a
// reset waits to be read) without consuming anything: bytes waiting (a
// pipelined request) are no close. It never blocks.
func PeerClosed(c net.Conn) bool {
	switch cc := c.(type) {
	case *Conn:
		c = cc.TCPConn
	case *tls.Conn:
		return PeerClosed(cc.NetConn())
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	if err := rc.Control(func(fd uintptr) { closed = fdClosed(int(fd)) }); err != nil {
		return false
	}
	return closed
}
