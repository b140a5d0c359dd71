package front

import (
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
)

// HTTP conformance of what a client sends, the same on both paths (the
// lane serves only HTTP/1.1 requests whose target is exactly an inference
// path, and leaves every other one to fasthttp's path, which checks it
// here):
//
//   - HTTP/1.0 and HTTP/1.1 are served; any other version (HTTP/1.2,
//     HTTP/2.0 in a text request line, HTTP/0.9) is refused 505, never
//     forwarded as it came (refuseVersion, clientconn.ServedVersion).
//   - The path routed on is the path forwarded: a request target whose
//     path is not already in normal form — a "." or ".." segment, an empty
//     one ("//"), a percent-encoded byte (fasthttp decodes "%2e" and "%2F"
//     before it routes; the engine gets the raw bytes) — or that carries a
//     fragment is refused 400 (refuseTarget, clientconn.NormalTarget). An
//     absolute-form target ("http://h/v1/completions") is routed on its
//     path, and its legs carry that path and query in origin form
//     (clientconn.OriginForm).
//   - A Host that is no host[:port] ("evil.example:80/path") is refused 400
//     by fasthttp's request parser; the lane parses it as fasthttp does
//     (laneLoop.parseHead) and leaves such a request to fasthttp.
//   - An HTTP/1.0 client cannot read chunked framing: a streamed answer to
//     it is close-delimited and the connection closes after it
//     (setStream); an answer of known length keeps the connection when the
//     client asked (Connection: keep-alive), as fasthttp keeps it. Every
//     answer's status line says HTTP/1.1, the sidecar's version (RFC 9110
//     section 6.2), whatever the upstream's said; every leg is HTTP/1.1.

// Sentinel errors of the conformance checks.
var (
	// ErrHTTPVersion: the request line names an HTTP version other than
	// 1.0 and 1.1 (505).
	ErrHTTPVersion = errors.New("HTTP version not supported: HTTP/1.1 and HTTP/1.0 only")
	// ErrPathNotNormal: the request target's path is not in normal form,
	// or the target has a fragment (400).
	ErrPathNotNormal = errors.New("request target not in normal form: no dot segments, empty segments, percent-encoded bytes in the path, or fragment")
)

// refuseVersion answers 505 JSON, counted, to a request of an HTTP version
// the sidecar does not serve, and closes the connection after it. It
// reports whether it answered.
func refuseVersion(p *inference.Proxy, rc *fasthttp.RequestCtx) bool {
	if clientconn.ServedVersion(rc.Request.Header.Protocol()) {
		return false
	}
	p.Reject(rc, metrics.RejectHTTPVersion, fasthttp.StatusHTTPVersionNotSupported, ErrHTTPVersion)
	rc.SetConnectionClose()
	return true
}

// refuseTarget answers 400 JSON, counted, to a request whose target is not
// in normal form (clientconn.NormalTarget), and closes the connection after
// it. It reports whether it answered. A CONNECT is left to the passthrough
// policy.
func refuseTarget(p *inference.Proxy, rc *fasthttp.RequestCtx) bool {
	// CONNECT's target is an authority, not a path: the passthrough
	// policy judges it (a 405 unless --passthrough-policy all).
	if rc.IsConnect() || clientconn.NormalTarget(rc.Request.Header.RequestURI(), rc.URI()) {
		return false
	}
	p.Reject(rc, metrics.RejectPathNotNormal, fasthttp.StatusBadRequest, ErrPathNotNormal)
	rc.SetConnectionClose()
	return true
}
