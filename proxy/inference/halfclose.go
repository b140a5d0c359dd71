package inference

import "github.com/pd-sidecar/pd-sidecar/proxy/clientconn"

// A client that shuts its side of the connection before its answer is
// taken as gone, on both paths (docs/security.md, "Half-closed clients"):
// nothing is written, the request counts 499. The lane's event loop sees
// the FIN (a hang-up) while the request waits; fasthttp's path has its
// clientconn.Watch, armed only after clientconn.WatchDelay, so an answer
// that comes sooner is checked for the FIN before it is written
// (request.leftNow).

// LeftNow reports whether the client of a request on fasthttp's path left
// before its answer began: the watch saw it, or it half-closed (or reset)
// the connection since (clientconn.PeerClosed), in which case the request
// is cancelled as the watch would have. The caller answers nothing then
// (the request ends as leftBeforeAnswer ends it).
func (r *Request) LeftNow() bool {
	switch {
	case r.Gone():
		return true
	case r.RC == nil || r.Detached:
		return false
	case clientconn.PeerClosed(r.RC.Conn()):
		r.Cancel(ErrClientGone)
		return true
	}
	return false
}
