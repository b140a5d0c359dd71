package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// readRequest reads a whole request as fasthttp's server does.
func readRequest(t *testing.T, in string) *fasthttp.Request {
	t.Helper()
	var req fasthttp.Request
	require.NoError(t, req.Read(bufio.NewReader(strings.NewReader(in))))
	return &req
}

// TestDropTrailers: a chunked request's trailer fields are gone from the
// head the sidecar reads and from every leg built from it; the head's own
// fields under the same names stay.
func TestDropTrailers(t *testing.T) {
	for _, tc := range []struct {
		name, head, trailer string
		prefiller, custom   string // what the head says
	}{
		{"trailer only", "", "X-PREFILLER-host-port: evil:1\r\nX-Custom: t\r\nX-Request-Id: trailer\r\n", "", ""},
		{"head and trailer", "x-prefiller-host-port: good:1\r\nX-Custom: h\r\nTrailer: x-prefiller-host-port, X-Custom\r\n",
			"x-prefiller-host-port: evil:1\r\nX-Custom: t\r\n", "good:1", "h"},
		{"declared only", "Trailer: X-Custom\r\n", "", "", ""},
		{"no trailer", "X-Custom: h\r\n", "", "", "h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := readRequest(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"+tc.head+
				"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"+tc.trailer+"\r\n")
			h := &req.Header
			dropTrailers(h)
			assert.Empty(t, h.PeekTrailerKeys())
			assert.Equal(t, tc.prefiller, string(h.Peek(HeaderPrefiller)))
			assert.Equal(t, tc.custom, string(h.Peek("X-Custom")))
			assert.Empty(t, h.Peek(HeaderRequestID))
			r := &request{id: "rid"}
			var leg fasthttp.Request
			r.upstreamHeader(&leg.Header, h, "127.0.0.1:1")
			leg.SetBodyRaw([]byte("{}"))
			wire := leg.String()
			assert.NotContains(t, wire, "evil")
			assert.NotContains(t, wire, ": t\r\n")
			assert.NotContains(t, strings.ToLower(wire), "trailer")
			assert.Contains(t, wire, "\r\nContent-Length: 2\r\n", "the leg is not chunked")
		})
	}
}

func TestBadHeaderName(t *testing.T) {
	for _, tc := range []struct {
		fields string
		bad    bool
	}{
		{"X-Foo: a b: c\r\n", false},
		{"X Foo: bar\r\n", true},
		{"X-A: 1\r\n folded: x y\r\nX-B: 2\r\n", false},
		{"Cookie: a=b\r\nCookie: c=d\r\n", false},
	} {
		req := readRequest(t, "POST / HTTP/1.1\r\nHost: x\r\n"+tc.fields+"Content-Length: 0\r\n\r\n")
		assert.Equal(t, tc.bad, badHeaderName(&req.Header), "%q", tc.fields)
	}
}

// TestSafeParseError: an error of fasthttp's own fixed text is named, any
// other (whose text may quote the request) is not.
func TestSafeParseError(t *testing.T) {
	quoting := fmt.Errorf("invalid header value %q", "Bearer secret")
	assert.Equal(t, errUnparsable, safeParseError(quoting))
	assert.Equal(t, fasthttp.ErrNonNumericChars, safeParseError(fmt.Errorf("x: %w", fasthttp.ErrNonNumericChars)))
	assert.NotContains(t, logSafe(quoting).Error(), "secret")
	assert.True(t, errors.Is(logSafe(fasthttp.ErrBodyTooLarge), fasthttp.ErrBodyTooLarge))
}
