package proxy

import (
	"crypto/tls"
	"net"
	"syscall"

	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
)

// A client that shuts its side of the connection before its answer is
// taken as gone, on both paths (docs/security.md, "Half-closed clients"):
// nothing is written, the request counts 499. The lane's event loop sees
// the FIN (a hang-up) while the request waits; fasthttp's path has its
// connWatch, armed only after watchDelay, so an answer that comes sooner
// is checked for the FIN before it is written (request.leftNow).

// peerClosed reports whether the peer of c has closed its side (a FIN or a
// reset waits to be read) without consuming anything: bytes waiting (a
// pipelined request) are no close. It never blocks.
func peerClosed(c net.Conn) bool {
	switch cc := c.(type) {
	case *clientconn.Conn:
		c = cc.TCPConn
	case *tls.Conn:
		return peerClosed(cc.NetConn())
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

// leftNow reports whether the client of a request on fasthttp's path left
// before its answer began: the watch saw it, or it half-closed (or reset)
// the connection since (peerClosed), in which case the request is
// cancelled as the watch would have. The caller answers nothing then (the
// request ends as leftBeforeAnswer ends it).
func (r *request) leftNow() bool {
	switch {
	case r.gone():
		return true
	case r.rc == nil || r.detached:
		return false
	case peerClosed(r.rc.Conn()):
		r.cancel(ErrClientGone)
		return true
	}
	return false
}
