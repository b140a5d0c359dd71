package relay

import (
	"bufio"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
)

// readRequest reads a whole request as fasthttp's server does.
func readRequest(t *testing.T, in string) *fasthttp.Request {
	t.Helper()
	var req fasthttp.Request
	require.NoError(t, req.Read(bufio.NewReader(strings.NewReader(in))))
	return &req
}

// TestTrailersReachNoLeg: a chunked request's trailer fields, dropped from
// the head the sidecar reads (clientconn.DropTrailers), are in no leg built
// from it; the head's own fields under the same names are.
func TestTrailersReachNoLeg(t *testing.T) {
	for _, tc := range []struct {
		name, head, trailer string
		prefiller, custom   string // what the head says
	}{
		{"trailer only", "", "X-PREFILLER-host-port: evil:1\r\nX-Custom: t\r\nX-Request-ID: trailer\r\n", "", ""},
		{"head and trailer", "x-prefiller-host-port: good:1\r\nX-Custom: h\r\nTrailer: x-prefiller-host-port, X-Custom\r\n",
			"x-prefiller-host-port: evil:1\r\nX-Custom: t\r\n", "good:1", "h"},
		{"declared only", "Trailer: X-Custom\r\n", "", "", ""},
		{"no trailer", "X-Custom: h\r\n", "", "", "h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := readRequest(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"+tc.head+
				"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"+tc.trailer+"\r\n")
			h := &req.Header
			clientconn.DropTrailers(h)
			assert.Equal(t, tc.prefiller, string(h.Peek(core.HeaderPrefiller)))
			assert.Empty(t, h.Peek(core.HeaderRequestID))
			var leg fasthttp.Request
			legHeader(&leg.Header, h, "127.0.0.1:1", core.LegSpec{ID: "rid"})
			leg.SetBodyRaw([]byte("{}"))
			wire := leg.String()
			assert.NotContains(t, wire, "evil")
			assert.NotContains(t, wire, ": t\r\n")
			assert.NotContains(t, strings.ToLower(wire), "trailer")
			assert.Contains(t, wire, "\r\nContent-Length: 2\r\n", "the leg is not chunked")
			if tc.custom != "" {
				assert.Contains(t, wire, "\r\nX-Custom: "+tc.custom+"\r\n", "the head's own field")
			}
		})
	}
}
