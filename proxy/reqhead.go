package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// What the sidecar takes from a client request's head, on both paths: the
// fields of the head only (never a chunked body's trailer section), each
// under a name that is an HTTP token; and what it says about a request it
// cannot parse: never the request's own bytes.

// ErrBadHeaderName: a header field name holds a byte that is not a token
// character (a space: "X Foo: bar"); such a head is refused, never
// forwarded (400).
var ErrBadHeaderName = errors.New("header field name is not a token")

// dropTrailers removes a chunked request's trailer section from h, so that
// nothing the sidecar decides on (the prefiller, the request id) and
// nothing it forwards comes from it: a gateway in front strips the
// prefiller header from the head only. fasthttp keeps trailer fields apart
// from the head's but answers Peek from either, announces every name it
// received in the trailer section as a Trailer of h, and moves the trailer
// fields into the head when Trailer is deleted (as the legs' builders
// delete every hop-by-hop field). The head's fields under those names are
// kept. A request with no trailer section costs one length check.
func dropTrailers(h *fasthttp.RequestHeader) {
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

// badHeaderName reports whether a field name of h is not a token. fasthttp
// refuses every other byte that is not a token character in a name, but
// keeps a name with an inner space ("X Foo") as it came. The head's wire
// bytes are read (h.All would parse the cookies, and forward them
// rewritten).
func badHeaderName(h *fasthttp.RequestHeader) bool {
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

// refuseHead answers 400 JSON, counted as malformed, to a request whose
// head has a field name that is not a token, and closes the connection
// after it (what a front proxy made of such a head is unknown). It reports
// whether it answered.
func (p *Proxy) refuseHead(rc *fasthttp.RequestCtx) bool {
	if !badHeaderName(&rc.Request.Header) {
		return false
	}
	p.reject(rc, metrics.RejectMalformed, fasthttp.StatusBadRequest, fmt.Errorf("%w: %w", ErrMalformed, ErrBadHeaderName))
	rc.SetConnectionClose()
	return true
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

// safeParseError is what may be said of fasthttp's error err about a
// client's request, in an answer or a log line: fasthttp's messages quote
// the request (its head, a header value, the request target), which may
// carry a credential (Authorization, a token in a query string). Only an
// error of fasthttp's own fixed text is named; any other is errUnparsable.
func safeParseError(err error) error {
	for _, e := range parseErrorNames {
		if errors.Is(err, e) {
			return e
		}
	}
	return errUnparsable
}

// logSafe is what fasthttp's own log lines may say of err: a connection's
// network error as it is (it names addresses only), any other through
// safeParseError.
func logSafe(err error) error {
	var op *net.OpError
	if errors.As(err, &op) || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	return safeParseError(err)
}
