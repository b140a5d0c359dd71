package proxy

import (
	"bytes"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/prefillstrip"
)

// The lane's heads are parsed by fasthttp with key normalizing off and
// written in one pass over the parsed headers: no header object is copied,
// and no key is normalized or looked up more than once (a leg's head,
// built as upstreamHeader builds it, costs the lane about as much as the
// rest of a request's work).

// equalFold reports whether b is s, ASCII case-insensitively; s is lower
// case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// hopHeader reports whether k is a hop-by-hop header (hopHeaders), or a
// framing one: none is forwarded, and the lane frames each message itself.
func hopHeader(k []byte) bool {
	switch len(k) {
	case 2:
		return equalFold(k, "te")
	case 7:
		return equalFold(k, "upgrade") || equalFold(k, "trailer")
	case 10:
		return equalFold(k, "connection") || equalFold(k, "keep-alive")
	case 14:
		return equalFold(k, "content-length")
	case 16:
		return equalFold(k, "proxy-connection")
	case 17:
		return equalFold(k, "transfer-encoding")
	case 18:
		return equalFold(k, "proxy-authenticate")
	case 19:
		return equalFold(k, "proxy-authorization")
	}
	return false
}

// laneRequest is what the lane needs to know of a client request's
// headers, found in one pass.
type laneRequest struct {
	id        []byte // X-Request-Id (the first)
	prefiller []byte // x-prefiller-host-port (the first; nil: a local request)
	refused   bool   // a header the lane leaves to fasthttp
	encoders  bool   // x-encoder-hosts-ports: fasthttp's while the encoder stage is on
	keepAlive bool
}

// scanRequest looks at h's headers: Expect and Upgrade are fasthttp's to
// serve, and so are a field name that is not a token (fasthttp's path
// refuses it: refuseHead) and x-data-parallel-host-port (its rank's engine
// or its 400: pickRank); so is x-encoder-hosts-ports while the encoder
// stage is on (the caller checks encoders); a named prefiller makes a P/D
// request.
func scanRequest(h *fasthttp.RequestHeader) laneRequest {
	lr := laneRequest{keepAlive: !h.ConnectionClose()}
	for k, v := range h.All() {
		if bytes.IndexByte(k, ' ') >= 0 {
			lr.refused = true
		}
		switch len(k) {
		case 6:
			lr.refused = lr.refused || equalFold(k, "expect")
		case 7:
			lr.refused = lr.refused || equalFold(k, "upgrade")
		case 12:
			if lr.id == nil && equalFold(k, "x-request-id") {
				lr.id = v
			}
		case len(HeaderPrefiller): // == len(HeaderEncoders)
			if lr.prefiller == nil && equalFold(k, HeaderPrefiller) {
				lr.prefiller = v
			}
			lr.encoders = lr.encoders || equalFold(k, HeaderEncoders)
		case len(HeaderDataParallel):
			lr.refused = lr.refused || equalFold(k, HeaderDataParallel)
		}
	}
	return lr
}

// appendLegHead appends the head of the leg to addr carrying a body of
// bodyLen bytes: h's request line and end-to-end headers (those
// upstreamHeader keeps), then Host, Content-Length and the request id.
func appendLegHead(dst []byte, h *fasthttp.RequestHeader, addr, id string, bodyLen int) []byte {
	return appendLegEnd(appendLegStart(dst, h), addr, id, bodyLen)
}

// appendLegStart appends the part of a leg's head every leg of a request
// shares: h's request line and end-to-end headers.
func appendLegStart(dst []byte, h *fasthttp.RequestHeader) []byte {
	return appendLegStartAt(dst, h, h.RequestURI(), nil)
}

// appendLegStartStrip appends a leg's head start as appendLegStart does,
// less the headers named in strip (lower case): a prefill leg's under
// --prefill-strip-headers (proxy/prefillstrip).
func appendLegStartStrip(dst []byte, h *fasthttp.RequestHeader, strip []string) []byte {
	return appendLegStartAt(dst, h, h.RequestURI(), strip)
}

// appendLegStartAt is appendLegStartStrip with the request target target.
func appendLegStartAt(dst []byte, h *fasthttp.RequestHeader, target []byte, strip []string) []byte {
	dst = append(dst, h.Method()...)
	dst = append(dst, ' ')
	dst = append(dst, target...)
	dst = append(dst, " HTTP/1.1\r\n"...)
	for k, v := range h.All() {
		switch {
		case hopHeader(k):
			continue
		case len(k) == 4 && equalFold(k, "host"),
			len(k) == 6 && equalFold(k, "expect"),
			len(k) == 12 && equalFold(k, "x-request-id"),
			len(k) == 15 && equalFold(k, "accept-encoding"),
			len(k) == len(HeaderPrefiller) && equalFold(k, HeaderPrefiller),
			len(k) == len(HeaderEncoders) && equalFold(k, HeaderEncoders),
			len(k) == len(HeaderDataParallel) && equalFold(k, HeaderDataParallel),
			len(k) == len(HeaderKVCacheSource) && equalFold(k, HeaderKVCacheSource),
			len(strip) > 0 && prefillstrip.Stripped(k, strip):
			continue
		}
		dst = appendHeaderLine(dst, k, v)
	}
	return dst
}

// appendLegEnd ends a leg's head begun by appendLegStart: Host,
// Content-Length and the request id.
func appendLegEnd(dst []byte, addr, id string, bodyLen int) []byte {
	dst = append(dst, "Host: "...)
	dst = append(dst, addr...)
	dst = append(dst, "\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(bodyLen), 10)
	dst = append(dst, "\r\nX-Request-Id: "...)
	dst = append(dst, id...)
	return append(dst, "\r\n\r\n"...)
}

// appendAnswerHead appends the client's answer head: h's status and
// end-to-end headers (those copyHead keeps), our request id, the body
// framed by contentLength (-1: chunked), and Connection: close unless
// keepAlive.
func appendAnswerHead(dst []byte, h *fasthttp.ResponseHeader, id string, contentLength int, keepAlive bool) []byte {
	st := h.StatusCode()
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(st), 10)
	dst = append(dst, ' ')
	if msg := h.StatusMessage(); len(msg) > 0 {
		dst = append(dst, msg...)
	} else {
		dst = append(dst, fasthttp.StatusMessage(st)...)
	}
	dst = append(dst, "\r\n"...)
	for k, v := range h.All() {
		if hopHeader(k) || len(k) == 12 && equalFold(k, "x-request-id") {
			continue
		}
		dst = appendHeaderLine(dst, k, v)
	}
	dst = append(dst, "X-Request-Id: "...)
	dst = append(dst, id...)
	dst = append(dst, "\r\n"...)
	switch {
	case st < 200 || st == fasthttp.StatusNoContent || st == fasthttp.StatusNotModified:
	case contentLength >= 0:
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, int64(contentLength), 10)
		dst = append(dst, "\r\n"...)
	default:
		dst = append(dst, "Transfer-Encoding: chunked\r\n"...)
	}
	if !keepAlive {
		dst = append(dst, "Connection: close\r\n"...)
	}
	return append(dst, "\r\n"...)
}

func appendHeaderLine(dst, k, v []byte) []byte {
	dst = append(dst, k...)
	dst = append(dst, ": "...)
	dst = append(dst, v...)
	return append(dst, "\r\n"...)
}
