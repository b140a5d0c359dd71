package clientconn

import (
	"bytes"
	"errors"
	"net"
	"os"

	"github.com/valyala/fasthttp"
)

// What the sidecar takes from a client request's head, on both paths: the
// fields of the head only (never a chunked body's trailer section), each
// under a name that is an HTTP token, of a version it serves, with a
// target in normal form; and what it says about a request it cannot
// parse: never the request's own bytes.

// DropTrailers removes a chunked request's trailer section from h, so that
// nothing the sidecar decides on (the prefiller, the request id) and
// nothing it forwards comes from it: a gateway in front strips the
// prefiller header from the head only. fasthttp keeps trailer fields apart
// from the head's but answers Peek from either, announces every name it
// received in the trailer section as a Trailer of h, and moves the trailer
// fields into the head when Trailer is deleted (as the legs' builders
// delete every hop-by-hop field). The head's fields under those names are
// kept. A request with no trailer section costs one length check.
func DropTrailers(h *fasthttp.RequestHeader) {
	announced := h.PeekTrailerKeys()
	if len(announced) == 0 {
		return
	}
	names := make([][]byte, len(announced))
	for i, n := range announced {
		names[i] = bytes.Clone(n)
	}
	var head [][2][]byte // the head's own fields under those names
	for k, v := range h.All() {
		for _, n := range names {
			if bytes.Equal(k, n) {
				head = append(head, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
				break
			}
		}
	}
	for _, n := range names {
		h.DelBytes(n) // both sections
	}
	h.Del(fasthttp.HeaderTrailer) // the announced names; no field is left to move
	for _, kv := range head {
		h.AddBytesKV(kv[0], kv[1])
	}
}

// BadHeaderName reports whether a field name of h is not a token. fasthttp
// refuses every other byte that is not a token character in a name, but
// keeps a name with an inner space ("X Foo") as it came. The head's wire
// bytes are read (h.All would parse the cookies, and forward them
// rewritten).
func BadHeaderName(h *fasthttp.RequestHeader) bool {
	for raw := h.RawHeaders(); len(raw) > 0; {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if len(line) == 0 || line[0] == ' ' || line[0] == '\t' {
			continue // the blank line, or a folded value's next line
		}
		if i := bytes.IndexByte(line, ':'); i > 0 && bytes.IndexByte(line[:i], ' ') >= 0 {
			return true
		}
	}
	return false
}

var (
	strHTTP10 = []byte("HTTP/1.0")
	strHTTP11 = []byte("HTTP/1.1")
)

// ServedVersion reports whether proto, the version a request line names,
// is one the sidecar serves: HTTP/1.1 or HTTP/1.0.
func ServedVersion(proto []byte) bool {
	return bytes.Equal(proto, strHTTP11) || bytes.Equal(proto, strHTTP10)
}

// NormalTarget reports whether the request target raw, parsed into u, is
// one whose path fasthttp routes on as it came: u's path is the path as
// sent (raw up to its query; an absolute-form target's after its
// authority), byte for byte, with no "%" in it (fasthttp decodes a valid
// escape, and keeps an invalid one, which an engine may not), and no
// fragment follows. The asterisk form ("OPTIONS *", which fasthttp admits
// for OPTIONS only) is left to the route it takes.
func NormalTarget(raw []byte, u *fasthttp.URI) bool {
	if len(raw) == 1 && raw[0] == '*' {
		return true
	}
	if bytes.IndexByte(raw, '#') >= 0 {
		return false
	}
	path := u.PathOriginal()
	if len(raw) > 0 && raw[0] == '/' { // origin form: forwarded as sent
		path, _, _ = bytes.Cut(raw, []byte("?"))
	}
	return bytes.IndexByte(path, '%') < 0 && bytes.Equal(path, u.Path())
}

// OriginForm is the origin-form target (path and query) a leg carries for
// the request of rc when its target is in absolute form; nil when it is
// origin-form already, and forwarded as it came.
func OriginForm(rc *fasthttp.RequestCtx) []byte {
	return originFormOf(rc.Request.Header.RequestURI(), rc.URI())
}

// originFormOf is OriginForm of the target raw, parsed into u.
func originFormOf(raw []byte, u *fasthttp.URI) []byte {
	if len(raw) == 0 || raw[0] == '/' || len(raw) == 1 && raw[0] == '*' {
		return nil
	}
	return u.RequestURI()
}

// parseErrorNames are fasthttp's errors of an unparsable request whose text
// holds none of the request's bytes.
var parseErrorNames = []error{
	fasthttp.ErrDuplicateContentLength, fasthttp.ErrUnsupportedTransferEncoding,
	fasthttp.ErrMissingRequestMethod, fasthttp.ErrUnsupportedRequestMethod,
	fasthttp.ErrExtraWhitespaceInRequestLine, fasthttp.ErrEmptyRequestURI,
	fasthttp.ErrNonNumericChars, fasthttp.ErrBadTrailer, fasthttp.ErrSmallReadBuffer,
	fasthttp.ErrBodyTooLarge,
}

// errUnparsable stands for a parse error whose text may hold request bytes.
var errUnparsable = errors.New("the request line, a header or the body framing could not be parsed")

// SafeParseError is what may be said of fasthttp's error err about a
// client's request, in an answer or a log line: fasthttp's messages quote
// the request (its head, a header value, the request target), which may
// carry a credential (Authorization, a token in a query string). Only an
// error of fasthttp's own fixed text is named; any other is errUnparsable.
func SafeParseError(err error) error {
	for _, e := range parseErrorNames {
		if errors.Is(err, e) {
			return e
		}
	}
	return errUnparsable
}

// LogSafe is what fasthttp's own log lines may say of err: a connection's
// network error as it is (it names addresses only), any other through
// SafeParseError.
func LogSafe(err error) error {
	var op *net.OpError
	if errors.As(err, &op) || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	return SafeParseError(err)
}
