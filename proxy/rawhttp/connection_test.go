package rawhttp_test

import (
	"bufio"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
)

// connectionCases are heads whose Connection fields name (or do not name)
// connection options, and the end-to-end fields a leg or an answer keeps.
var connectionCases = []struct {
	name, headers string
	kept          []string // the end-to-end fields forwarded, sorted, lower case
}{
	{"no Connection", "X-A: 1\r\n", []string{"x-a"}},
	{"keep-alive only", "Connection: keep-alive\r\nX-A: 1\r\n", []string{"x-a"}},
	{"close only", "Connection: close\r\nX-A: 1\r\n", []string{"x-a"}},
	{"one option", "Connection: X-Hop-Secret\r\nX-Hop-Secret: s\r\nX-A: 1\r\n", []string{"x-a"}},
	{"option after close, other letter case", "connection: close, x-hop-SECRET\r\nX-Hop-Secret: s\r\nX-A: 1\r\n", []string{"x-a"}},
	{"option named before its field, every copy", "X-Hop-Secret: s\r\nX-Hop-Secret: t\r\nConnection: keep-alive ,\tX-Hop-Secret , \r\nX-A: 1\r\n", []string{"x-a"}},
	{"two Connection fields", "Connection: keep-alive\r\nConnection: X-B\r\nX-B: 2\r\nX-A: 1\r\n", []string{"x-a"}},
	{"options the message is read by stay", "Connection: Content-Type, Host, Content-Length, Transfer-Encoding, X-A\r\nX-A: 1\r\nX-C: 3\r\n", []string{"content-type", "x-c"}},
	{"an option naming nothing present", "Connection: X-None\r\nX-A: 1\r\n", []string{"x-a"}},
}

// fieldNames are the end-to-end field names of a written head (not its
// first line, nor those the writer adds itself), sorted, lower case.
func fieldNames(t *testing.T, head string, own ...string) []string {
	t.Helper()
	var names []string
	for _, line := range strings.Split(strings.TrimSuffix(head, "\r\n\r\n"), "\r\n")[1:] {
		k, _, ok := strings.Cut(line, ":")
		require.True(t, ok, line)
		k = strings.ToLower(k)
		if !slices.Contains(own, k) {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	return names
}

// TestLegLeavesConnectionOptionsOut: the lane's leg heads and the fasthttp
// path's (DelOptions on fasthttp's parsed head) forward the same fields:
// none that a Connection field names, but those the message is read by.
func TestLegLeavesConnectionOptionsOut(t *testing.T) {
	for _, tc := range connectionCases {
		t.Run(tc.name, func(t *testing.T) {
			raw := "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + tc.headers + "Content-Length: 2\r\n\r\n"
			kept := append([]string{"content-type"}, tc.kept...)
			sort.Strings(kept)
			kept = slices.Compact(kept)

			lane := rawhttp.AppendLegHead(nil, parseRequestHead(t, raw), "e:1", "id", 2)
			assert.Equal(t, kept, fieldNames(t, string(lane), "host", "content-length", "x-request-id"), "lane: %q", lane)

			var h fasthttp.RequestHeader // fasthttp's server parses with names normalized
			require.NoError(t, h.Read(bufio.NewReader(strings.NewReader(raw))))
			rawhttp.DelOptions(&h)
			h.Del("Connection")
			h.SetHost("e:1")
			assert.Equal(t, kept, fieldNames(t, string(h.Header()), "host", "content-length"), "fasthttp: %q", h.Header())
		})
	}
}

// TestAnswerLeavesConnectionOptionsOut: an engine's answer reaches the
// client without the fields its Connection fields name, from the lane's
// head writer and through DelOptions alike.
func TestAnswerLeavesConnectionOptionsOut(t *testing.T) {
	for _, tc := range connectionCases {
		t.Run(tc.name, func(t *testing.T) {
			raw := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + tc.headers + "Content-Length: 2\r\n\r\n"
			kept := append([]string{"content-type"}, tc.kept...)
			sort.Strings(kept)
			kept = slices.Compact(kept)

			var lh fasthttp.ResponseHeader
			lh.DisableNormalizing()
			require.NoError(t, lh.Read(bufio.NewReader(strings.NewReader(raw))))
			lane := rawhttp.AppendAnswerHead(nil, &lh, "id", 2, true)
			assert.Equal(t, kept, fieldNames(t, string(lane), "content-length", "x-request-id"), "lane: %q", lane)
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(lane))), nil)
			require.NoError(t, err, "a well-formed head")
			assert.False(t, resp.Close, "Connection: close is the client's decision, not the engine's")

			var h fasthttp.ResponseHeader
			require.NoError(t, h.Read(bufio.NewReader(strings.NewReader(raw))))
			rawhttp.DelOptions(&h)
			h.Del("Connection")
			h.SetNoDefaultContentType(true)
			assert.Equal(t, kept, fieldNames(t, string(h.Header()), "content-length", "server", "date"), "fasthttp: %q", h.Header())
		})
	}
}
