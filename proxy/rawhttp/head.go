package rawhttp

import (
	"bytes"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/prefillstrip"
)

// The sidecar's own request headers, lower case: a leg never carries them
// (the sidecar's proxy package names them HeaderPrefiller and so on).
const (
	// HeaderPrefiller names the prefill engine(s).
	HeaderPrefiller = "x-prefiller-host-port"
	// HeaderEncoders names the encoders of the encoder stage.
	HeaderEncoders = "x-encoder-hosts-ports"
	// HeaderDataParallel is llm-d's deprecated rank selector.
	HeaderDataParallel = "x-data-parallel-host-port"
	// HeaderKVCacheSource names an engine holding the prompt's cached
	// prefix.
	HeaderKVCacheSource = "x-kv-cache-source-host-port"
)

// EqualFold reports whether b is s, ASCII case-insensitively; s is lower
// case.
func EqualFold(b []byte, s string) bool {
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

// hopHeader reports whether k is a hop-by-hop header (those the fasthttp
// path never forwards), or a framing one: none is forwarded, and the lane
// frames each message itself.
func hopHeader(k []byte) bool {
	switch len(k) {
	case 2:
		return EqualFold(k, "te")
	case 7:
		return EqualFold(k, "upgrade") || EqualFold(k, "trailer")
	case 10:
		return EqualFold(k, "connection") || EqualFold(k, "keep-alive")
	case 14:
		return EqualFold(k, "content-length")
	case 16:
		return EqualFold(k, "proxy-connection")
	case 17:
		return EqualFold(k, "transfer-encoding")
	case 18:
		return EqualFold(k, "proxy-authenticate")
	case 19:
		return EqualFold(k, "proxy-authorization")
	}
	return false
}

// Request is what the lane needs to know of a client request's headers,
// found in one pass (ScanRequest).
type Request struct {
	ID        []byte // X-Request-Id (the first)
	Prefiller []byte // x-prefiller-host-port (the first; nil: a local request)
	Refused   bool   // a header the lane leaves to fasthttp
	Encoders  bool   // x-encoder-hosts-ports: fasthttp's while the encoder stage is on
	KeepAlive bool
}

// ScanRequest looks at h's headers: Expect and Upgrade are fasthttp's to
// serve, and so is a field name that is not a token (the fasthttp path
// refuses it); so is x-encoder-hosts-ports while the encoder stage is on
// (the caller checks Encoders); a named prefiller makes a P/D request.
func ScanRequest(h *fasthttp.RequestHeader) Request {
	lr := Request{KeepAlive: !h.ConnectionClose()}
	for k, v := range h.All() {
		if bytes.IndexByte(k, ' ') >= 0 {
			lr.Refused = true
		}
		switch len(k) {
		case 6:
			lr.Refused = lr.Refused || EqualFold(k, "expect")
		case 7:
			lr.Refused = lr.Refused || EqualFold(k, "upgrade")
		case 12:
			if lr.ID == nil && EqualFold(k, "x-request-id") {
				lr.ID = v
			}
		case len(HeaderPrefiller): // == len(HeaderEncoders)
			if lr.Prefiller == nil && EqualFold(k, HeaderPrefiller) {
				lr.Prefiller = v
			}
			lr.Encoders = lr.Encoders || EqualFold(k, HeaderEncoders)
		}
	}
	return lr
}

// AppendLegHead appends the head of the leg to addr carrying a body of
// bodyLen bytes: h's request line and end-to-end headers (those the
// fasthttp path's legs keep), then Host, Content-Length and the request
// id.
func AppendLegHead(dst []byte, h *fasthttp.RequestHeader, addr, id string, bodyLen int) []byte {
	return AppendLegEnd(AppendLegStart(dst, h), addr, id, bodyLen)
}

// AppendLegStart appends the part of a leg's head every leg of a request
// shares: h's request line and end-to-end headers.
func AppendLegStart(dst []byte, h *fasthttp.RequestHeader) []byte {
	return AppendLegStartAt(dst, h, h.RequestURI(), nil)
}

// AppendLegStartStrip appends a leg's head start as AppendLegStart does,
// less the headers named in strip (lower case): a prefill leg's under
// --prefill-strip-headers.
func AppendLegStartStrip(dst []byte, h *fasthttp.RequestHeader, strip []string) []byte {
	return AppendLegStartAt(dst, h, h.RequestURI(), strip)
}

// AppendLegStartAt is AppendLegStartStrip with the request target target.
// The fields h's Connection fields name as connection options are left
// out (connection.go): found on the way, the head is then written again
// without them.
func AppendLegStartAt(dst []byte, h *fasthttp.RequestHeader, target []byte, strip []string) []byte {
	out, options := appendLegStart(dst, h, target, strip, nil)
	if options {
		out, _ = appendLegStart(dst, h, target, strip, connectionValues(h.All()))
	}
	return out
}

// appendLegStart appends a leg's head start, less the fields the
// Connection values conn name; options reports whether a Connection field
// of h names any (conn nil: none left out yet).
func appendLegStart(dst []byte, h *fasthttp.RequestHeader, target []byte, strip []string, conn [][]byte) (out []byte, options bool) {
	dst = append(dst, h.Method()...)
	dst = append(dst, ' ')
	dst = append(dst, target...)
	dst = append(dst, " HTTP/1.1\r\n"...)
	for k, v := range h.All() {
		switch {
		case hopHeader(k):
			options = options || isConnection(k) && namesOptions(v)
			continue
		case conn != nil && namedBy(k, conn):
			continue
		case len(k) == 4 && EqualFold(k, "host"),
			len(k) == 6 && EqualFold(k, "expect"),
			len(k) == 12 && EqualFold(k, "x-request-id"),
			len(k) == 15 && EqualFold(k, "accept-encoding"),
			len(k) == len(HeaderPrefiller) && EqualFold(k, HeaderPrefiller),
			len(k) == len(HeaderEncoders) && EqualFold(k, HeaderEncoders),
			len(k) == len(HeaderDataParallel) && EqualFold(k, HeaderDataParallel),
			len(k) == len(HeaderKVCacheSource) && EqualFold(k, HeaderKVCacheSource),
			len(strip) > 0 && prefillstrip.Stripped(k, strip):
			continue
		}
		dst = appendHeaderLine(dst, k, v)
	}
	return dst, options
}

// AppendLegEnd ends a leg's head begun by AppendLegStart: Host,
// Content-Length and the request id.
func AppendLegEnd(dst []byte, addr, id string, bodyLen int) []byte {
	dst = append(dst, "Host: "...)
	dst = append(dst, addr...)
	dst = append(dst, "\r\nContent-Length: "...)
	dst = strconv.AppendInt(dst, int64(bodyLen), 10)
	dst = append(dst, "\r\nX-Request-Id: "...)
	dst = append(dst, id...)
	return append(dst, "\r\n\r\n"...)
}

// AppendAnswerHead appends the client's answer head: h's status and
// end-to-end headers (those the fasthttp path's answers keep), our request
// id, the body framed by contentLength (-1: chunked), and Connection:
// close unless keepAlive.
//
// The fields h's Connection fields name as connection options are left out
// (connection.go): found on the way, the head is then written again
// without them.
func AppendAnswerHead(dst []byte, h *fasthttp.ResponseHeader, id string, contentLength int, keepAlive bool) []byte {
	out, options := appendAnswerHead(dst, h, id, contentLength, keepAlive, nil)
	if options {
		out, _ = appendAnswerHead(dst, h, id, contentLength, keepAlive, connectionValues(h.All()))
	}
	return out
}

// appendAnswerHead appends the client's answer head, less the fields the
// Connection values conn name; options reports whether a Connection field
// of h names any.
func appendAnswerHead(dst []byte, h *fasthttp.ResponseHeader, id string, contentLength int, keepAlive bool, conn [][]byte) (out []byte, options bool) {
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
		switch {
		case hopHeader(k):
			options = options || isConnection(k) && namesOptions(v)
			continue
		case len(k) == 12 && EqualFold(k, "x-request-id"), conn != nil && namedBy(k, conn):
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
	return append(dst, "\r\n"...), options
}

func appendHeaderLine(dst, k, v []byte) []byte {
	dst = append(dst, k...)
	dst = append(dst, ": "...)
	dst = append(dst, v...)
	return append(dst, "\r\n"...)
}
