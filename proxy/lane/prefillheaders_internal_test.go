package lane

import (
	"bufio"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/prefillstrip"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
)

// TestPrefillStripBothBuilders: the lane's leg head (appendLegStartStrip)
// and fasthttp's (prefillstrip.Strip on a leg upstreamHeader built) drop
// the same headers, every copy and in any letter case, and keep the rest.
func TestPrefillStripBothBuilders(t *testing.T) {
	const head = "POST /v1/completions HTTP/1.1\r\nHost: sidecar:8000\r\nContent-Type: application/json\r\n" +
		"authorization: Bearer secret\r\nCOOKIE: a=1\r\nCookie: b=2\r\nX-API-Key: k1\r\nx-api-key: k2\r\n" +
		"X-Custom: kept\r\nContent-Length: 2\r\n\r\n"
	for _, tc := range []struct {
		name  string
		strip []string
		gone  []string
		kept  []string
	}{
		{"none", nil, nil, []string{"Authorization", "Cookie", "X-API-Key", "X-Custom"}},
		{"credentials", []string{"Authorization", "Cookie", "X-API-Key"}, []string{"Authorization", "Cookie", "X-API-Key"}, []string{"X-Custom", "Content-Type"}},
		{"any case", []string{"AUTHORIZATION", "x-API-key"}, []string{"Authorization", "X-API-Key"}, []string{"Cookie", "X-Custom"}},
		{"absent name", []string{"X-Not-Sent"}, nil, []string{"Authorization", "Cookie", "X-API-Key", "X-Custom"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			strip := prefillstrip.Names(tc.strip)
			// The lane's: the head parsed with key normalizing off.
			lane := parseRequestHead(t, head)
			laneGot := rawhttp.AppendLegEnd(rawhttp.AppendLegStartStrip(nil, lane, strip), "127.0.0.1:8100", "rid", 2)
			laneReq, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(laneGot) + "{}")))
			require.NoError(t, err, "%s", laneGot)
			// fasthttp's: the server's parsed head, copied to a leg.
			var src fasthttp.RequestHeader
			require.NoError(t, src.Read(bufio.NewReader(strings.NewReader(head))))
			var leg fasthttp.RequestHeader
			src.CopyTo(&leg)
			prefillstrip.Strip(&leg, strip)
			leg.SetContentLength(2)
			fastReq, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(leg.Header()) + "{}")))
			require.NoError(t, err, "%s", leg.Header())
			for _, got := range []*http.Request{laneReq, fastReq} {
				for _, k := range tc.gone {
					assert.Empty(t, got.Header.Values(k), k)
				}
				for _, k := range tc.kept {
					assert.NotEmpty(t, got.Header.Values(k), k)
				}
			}
			assert.ElementsMatch(t, laneReq.Header.Values("X-API-Key"), fastReq.Header.Values("X-API-Key"))
			assert.Equal(t, len(laneReq.Cookies()), len(fastReq.Cookies()), "cookies")
		})
	}
}
