package lane

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/dprank"
	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvsource"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
)

// parseRequestHead parses a request head as the lane does (key
// normalizing off).
func parseRequestHead(t *testing.T, head string) *fasthttp.RequestHeader {
	t.Helper()
	var h fasthttp.RequestHeader
	h.DisableNormalizing()
	require.NoError(t, h.Read(bufio.NewReader(strings.NewReader(head))))
	return &h
}

// TestLaneHeaderNames: the lane matches the sidecar's own headers by the
// names rawhttp holds, which are the ones the fasthttp path strips.
func TestLaneHeaderNames(t *testing.T) {
	for _, tc := range []struct{ lane, proxy string }{
		{rawhttp.HeaderPrefiller, core.HeaderPrefiller},
		{rawhttp.HeaderEncoders, encoder.Header},
		{rawhttp.HeaderDataParallel, dprank.Header},
		{rawhttp.HeaderKVCacheSource, kvsource.Header},
	} {
		assert.Equal(t, tc.proxy, tc.lane)
	}
}

// FuzzLaneRequestHead: whatever request bytes a client sends, a request
// the lane takes names the prefiller fasthttp's parser (which normalizes
// keys) would see, so the lane splits exactly the requests the fasthttp
// path would, towards the same prefiller; and its leg is a well-formed
// HTTP/1.1 request to the engine that carries exactly the client's body
// and none of the hop-by-hop or sidecar headers; and a head the lane takes
// has only token field names (the fasthttp path refuses others).
func FuzzLaneRequestHead(f *testing.F) {
	for _, s := range []string{
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-prefiller-host-port: a:1\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-PREFILLER-HOST-PORT: a:1\r\nConnection: keep-alive, Te\r\nTe: trailers\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-ID: a\r\nx-request-id: b\r\nProxy-Authorization: z\r\nContent-Length: 0\r\n\r\n",
		"POST /v1/completions HTTP/1.1\nHost: x\nContent-Length: 2\r\n\r\n{}",
		"\r\n\nPOST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX Foo: bar\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\nContent-Length: 2\r\n\r\n{}",
	} {
		f.Add([]byte(s))
	}
	p := &inference.Proxy{Sidecar: &core.Sidecar{Cfg: core.DefaultConfig()}}
	f.Fuzz(func(t *testing.T, in []byte) {
		var norm fasthttp.RequestHeader
		ll := &laneLoop{ln: &lane{p: p, local: "127.0.0.1:8001"}, br: bufio.NewReaderSize(nil, p.Cfg.Guard.MaxHeaderBytes)}
		ll.req.DisableNormalizing()
		_, body, lr, ok := ll.parse(in)
		if !ok {
			return // fasthttp's to serve
		}
		require.NoError(t, norm.Read(bufio.NewReaderSize(strings.NewReader(string(in)), p.Cfg.Guard.MaxHeaderBytes)), "%q", in)
		require.Equal(t, string(norm.Peek(core.HeaderPrefiller)), string(lr.Prefiller), "prefiller of %q", in)
		require.False(t, clientconn.BadHeaderName(&norm), "a name that is not a token taken by the lane: %q", in)
		leg := rawhttp.AppendLegHead(nil, &ll.req, "127.0.0.1:8001", "rid", len(body))
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(leg) + string(body))))
		require.NoError(t, err, "leg %q of %q", leg, in)
		require.Equal(t, "127.0.0.1:8001", req.Host)
		require.Equal(t, int64(len(body)), req.ContentLength)
		require.Empty(t, req.TransferEncoding)
		require.Equal(t, []string{"rid"}, req.Header.Values("X-Request-ID"))
		for _, k := range []string{core.HeaderPrefiller, dprank.Header, "Connection", "Keep-Alive", "Te", "Trailer",
			"Upgrade", "Proxy-Authorization", "Proxy-Connection", "Expect", "Accept-Encoding"} {
			require.Empty(t, req.Header.Values(k), "%s forwarded: %q", k, leg)
		}
		got, err := io.ReadAll(req.Body)
		require.NoError(t, err)
		require.Equal(t, string(body), string(got))
		require.False(t, lr.Refused)
	})
}
