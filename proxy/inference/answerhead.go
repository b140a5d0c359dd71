package inference

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/valyala/fasthttp"
)

// CopyResponseHead copies resp's status and end-to-end headers to rc's
// answer: not the hop-by-hop ones, nor the connection options its
// Connection fields name.
func CopyResponseHead(rc *fasthttp.RequestCtx, resp *fasthttp.Response) {
	resp.Header.CopyTo(&rc.Response.Header)
	rawhttp.DelOptions(&rc.Response.Header)
	// The status line is the sidecar's, HTTP/1.1 as in every answer it
	// makes (an HTTP/1.0 client gets framing it reads: setStream),
	// never the upstream's version.
	rc.Response.Header.SetProtocol(nil)
	for _, h := range core.HopHeaders {
		rc.Response.Header.Del(h)
	}
}
