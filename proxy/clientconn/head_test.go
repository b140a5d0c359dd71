package clientconn

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// TestNormalTarget: a target is served only when the path fasthttp routes
// on is the path as sent.
func TestNormalTarget(t *testing.T) {
	for _, tc := range []struct {
		target string
		ok     bool
	}{
		{"/v1/completions", true},
		{"/v1/completions?a=../b&c=%2e", true},
		{"/v1/models", true},
		{"/", true},
		{"*", true},
		{"http://engine.example/v1/completions?x=1", true},
		{"/v1/../v1/completions", false},
		{"/v1/%2e%2e/v1/completions", false},
		{"/v1/%2E%2E/v1/completions", false},
		{"/v1/%63ompletions", false},
		{"/v1%2Fcompletions", false},
		{"//v1/completions", false},
		{"/v1//completions", false},
		{"/v1/./completions", false},
		{"/v1/completions/.", false},
		{"/v1/completions/..", false},
		{"/v1/completions#top", false},
		{"/v1/%", false},
		{"/v1/%zz", false},
		{"/v1/completions?x#top", false},
		{"http://engine.example//v1/completions", false},
		{"http://engine.example/v1/../v1/completions", false},
	} {
		var u fasthttp.URI
		require.NoError(t, u.Parse([]byte("x"), []byte(tc.target)), tc.target)
		assert.Equal(t, tc.ok, NormalTarget([]byte(tc.target), &u), "%s (fasthttp routes on %q)", tc.target, u.Path())
	}
}

// FuzzNormalTarget: whatever the target, one the sidecar serves is
// forwarded (as sent, or in origin form) on the path it was routed on.
func FuzzNormalTarget(f *testing.F) {
	for _, s := range []string{"/v1/completions", "/v1/../v1/completions", "http://h/v1/completions?x=1", "//v1/x",
		"/a%2Fb", "/v1/completions#x", "*", "h://x//y", "/x://y/../z"} {
		f.Add([]byte("x"), []byte(s))
	}
	f.Fuzz(func(t *testing.T, host, target []byte) {
		var u fasthttp.URI
		if u.Parse(host, target) != nil || !NormalTarget(target, &u) || string(target) == "*" {
			return
		}
		fwd := target
		if o := originFormOf(target, &u); o != nil {
			fwd = o
		}
		path, _, _ := bytes.Cut(fwd, []byte("?"))
		got, err := url.PathUnescape(string(path))
		if err != nil || got != string(u.Path()) {
			t.Fatalf("target %q (host %q): routed on %q, forwarded %q", target, host, u.Path(), fwd)
		}
	})
}

// readRequest reads a whole request as fasthttp's server does.
func readRequest(t *testing.T, in string) *fasthttp.Request {
	t.Helper()
	var req fasthttp.Request
	require.NoError(t, req.Read(bufio.NewReader(strings.NewReader(in))))
	return &req
}

// TestDropTrailers: a chunked request's trailer fields are gone from the
// head the sidecar reads; the head's own fields under the same names stay.
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
			DropTrailers(h)
			assert.Empty(t, h.PeekTrailerKeys())
			assert.Equal(t, tc.prefiller, string(h.Peek("x-prefiller-host-port")))
			assert.Equal(t, tc.custom, string(h.Peek("X-Custom")))
			assert.Empty(t, h.Peek("X-Request-Id"))
			assert.Empty(t, h.Peek(fasthttp.HeaderTrailer))
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
		assert.Equal(t, tc.bad, BadHeaderName(&req.Header), "%q", tc.fields)
	}
}

// TestServedVersion: HTTP/1.1 and HTTP/1.0 are served, no other version.
func TestServedVersion(t *testing.T) {
	for _, tc := range []struct {
		proto string
		ok    bool
	}{
		{"HTTP/1.1", true},
		{"HTTP/1.0", true},
		{"HTTP/1.2", false},
		{"HTTP/2.0", false},
		{"HTTP/0.9", false},
		{"http/1.1", false},
		{"", false},
	} {
		assert.Equal(t, tc.ok, ServedVersion([]byte(tc.proto)), "%q", tc.proto)
	}
}

// TestSafeParseError: an error of fasthttp's own fixed text is named, any
// other (whose text may quote the request) is not.
func TestSafeParseError(t *testing.T) {
	quoting := fmt.Errorf("invalid header value %q", "Bearer secret")
	assert.Equal(t, errUnparsable, SafeParseError(quoting))
	assert.Equal(t, fasthttp.ErrNonNumericChars, SafeParseError(fmt.Errorf("x: %w", fasthttp.ErrNonNumericChars)))
	assert.NotContains(t, LogSafe(quoting).Error(), "secret")
	assert.True(t, errors.Is(LogSafe(fasthttp.ErrBodyTooLarge), fasthttp.ErrBodyTooLarge))
}
