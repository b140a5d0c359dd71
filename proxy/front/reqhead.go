package front

import (
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
)

// What the sidecar takes from a client request's head, on both paths, is
// what clientconn says: the fields of the head only
// (clientconn.DropTrailers), each under a name that is an HTTP token
// (clientconn.BadHeaderName); and what it says about a request it cannot
// parse is never the request's own bytes (clientconn.SafeParseError).

// ErrBadHeaderName: a header field name holds a byte that is not a token
// character (a space: "X Foo: bar"); such a head is refused, never
// forwarded (400).
var ErrBadHeaderName = errors.New("header field name is not a token")

// refuseHead answers 400 JSON, counted as malformed, to a request whose
// head has a field name that is not a token, and closes the connection
// after it (what a front proxy made of such a head is unknown). It reports
// whether it answered.
func refuseHead(p *inference.Proxy, rc *fasthttp.RequestCtx) bool {
	if !clientconn.BadHeaderName(&rc.Request.Header) {
		return false
	}
	p.Reject(rc, metrics.RejectMalformed, fasthttp.StatusBadRequest, fmt.Errorf("%w: %w", core.ErrMalformed, ErrBadHeaderName))
	rc.SetConnectionClose()
	return true
}
