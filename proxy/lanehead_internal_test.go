package proxy

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

func TestScanRequest(t *testing.T) {
	for _, tc := range []struct {
		name, headers string
		refused, keep bool
		id, prefiller string
	}{
		{"plain", "Content-Type: application/json\r\n", false, true, "", ""},
		{"request id, first kept", "x-REQUEST-id: abc\r\nX-Request-Id: def\r\n", false, true, "abc", ""},
		{"prefiller, any case", "X-Prefiller-HOST-Port: 10.0.0.1:8000\r\n", false, true, "", "10.0.0.1:8000"},
		{"prefiller, first kept", "x-prefiller-host-port: a:1\r\nX-Prefiller-Host-Port: b:2\r\n", false, true, "", "a:1"},
		{"expect", "expect: 100-continue\r\n", true, true, "", ""},
		{"upgrade", "Connection: Upgrade\r\nUPGRADE: websocket\r\n", true, true, "", ""},
		{"close", "connection: close\r\n", false, false, "", ""},
		{"data-parallel rank, any case: fasthttp's", "X-Data-Parallel-HOST-Port: 10.0.0.1:8001\r\n", true, true, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := parseRequestHead(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"+tc.headers+"Content-Length: 2\r\n\r\n")
			lr := scanRequest(h)
			assert.Equal(t, tc.refused, lr.refused)
			assert.Equal(t, tc.keep, lr.keepAlive)
			assert.Equal(t, tc.id, string(lr.id))
			assert.Equal(t, tc.prefiller, string(lr.prefiller))
		})
	}
}

// TestAppendLegHead: the leg keeps the client's end-to-end headers and
// drops, in any letter case, the hop-by-hop ones, the sidecar's own and
// those the sidecar sets itself, as upstreamHeader does.
func TestAppendLegHead(t *testing.T) {
	h := parseRequestHead(t, "POST /v1/chat/completions?x=1 HTTP/1.1\r\n"+
		"Host: sidecar:8000\r\nContent-Type: application/json\r\nUser-Agent: ua\r\nAuthorization: Bearer t\r\n"+
		"X-Custom: a\r\nx-custom: b\r\nconnection: keep-alive\r\nKEEP-ALIVE: timeout=5\r\nTE: trailers\r\n"+
		"Proxy-Authorization: p\r\nx-data-parallel-host-port: 10.0.0.2:8000\r\nAccept-Encoding: gzip\r\n"+
		"x-request-id: client-id\r\nContent-Length: 2\r\n\r\n")
	got := string(appendLegHead(nil, h, "127.0.0.1:8001", "rid", 2))
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(got + "{}")))
	require.NoError(t, err, got)
	assert.Equal(t, "/v1/chat/completions?x=1", req.RequestURI)
	assert.Equal(t, "127.0.0.1:8001", req.Host)
	assert.Equal(t, int64(2), req.ContentLength)
	assert.Equal(t, []string{"rid"}, req.Header.Values("X-Request-Id"))
	assert.Equal(t, "application/json", req.Header.Get("Content-Type"))
	assert.Equal(t, "ua", req.Header.Get("User-Agent"))
	assert.Equal(t, "Bearer t", req.Header.Get("Authorization"))
	assert.Equal(t, []string{"a", "b"}, req.Header.Values("X-Custom"), "repeated headers kept, in order")
	for _, k := range []string{"Connection", "Keep-Alive", "Te", "Proxy-Authorization", "X-Data-Parallel-Host-Port", "Accept-Encoding"} {
		assert.Empty(t, req.Header.Values(k), k)
	}
	assert.Equal(t, 1, strings.Count(strings.ToLower(got), "\r\nhost:"), got)
	assert.Equal(t, 1, strings.Count(strings.ToLower(got), "\r\ncontent-length:"), got)
}

func TestAppendAnswerHead(t *testing.T) {
	parse := func(head string) *fasthttp.ResponseHeader {
		var h fasthttp.ResponseHeader
		h.DisableNormalizing()
		require.NoError(t, h.Read(bufio.NewReader(strings.NewReader(head))))
		return &h
	}
	for _, tc := range []struct {
		name, head    string
		contentLength int
		keepAlive     bool
		want          []string // lines, in order
		absent        []string
	}{
		{"stream", "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\nx-request-id: engine\r\nx-other: 1\r\n\r\n",
			-1, true, []string{"HTTP/1.1 200 OK", "x-other: 1", "X-Request-Id: rid", "Transfer-Encoding: chunked"}, []string{"engine", "connection"}},
		{"json, closing", "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n",
			17, false, []string{"HTTP/1.1 400 Bad Request", "Content-Type: application/json", "Content-Length: 17", "Connection: close"}, []string{"Content-Length: 10"}},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\n", 0, true, []string{"HTTP/1.1 204 No Content"}, []string{"Content-Length", "Transfer-Encoding"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := string(appendAnswerHead(nil, parse(tc.head), "rid", tc.contentLength, tc.keepAlive))
			require.True(t, strings.HasSuffix(got, "\r\n\r\n"), got)
			lines := strings.Split(strings.TrimSuffix(got, "\r\n\r\n"), "\r\n")
			i := 0
			for _, l := range lines {
				if i < len(tc.want) && l == tc.want[i] {
					i++
				}
			}
			assert.Equal(t, len(tc.want), i, "lines %q in order in %q", tc.want, got)
			for _, a := range tc.absent {
				assert.NotContains(t, strings.ToLower(got), strings.ToLower(a))
			}
		})
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
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\r\nx-request-id: b\r\nProxy-Authorization: z\r\nContent-Length: 0\r\n\r\n",
		"POST /v1/completions HTTP/1.1\nHost: x\nContent-Length: 2\r\n\r\n{}",
		"\r\n\nPOST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX Foo: bar\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\nContent-Length: 2\r\n\r\n{}",
	} {
		f.Add([]byte(s))
	}
	p := &Proxy{cfg: DefaultConfig()}
	f.Fuzz(func(t *testing.T, in []byte) {
		var norm fasthttp.RequestHeader
		ll := &laneLoop{ln: &lane{p: p, local: "127.0.0.1:8001"}, br: bufio.NewReaderSize(nil, p.cfg.Guard.MaxHeaderBytes)}
		ll.req.DisableNormalizing()
		_, body, lr, ok := ll.parse(in)
		if !ok {
			return // fasthttp's to serve
		}
		require.NoError(t, norm.Read(bufio.NewReaderSize(strings.NewReader(string(in)), p.cfg.Guard.MaxHeaderBytes)), "%q", in)
		require.Equal(t, string(norm.Peek(HeaderPrefiller)), string(lr.prefiller), "prefiller of %q", in)
		require.False(t, clientconn.BadHeaderName(&norm), "a name that is not a token taken by the lane: %q", in)
		leg := appendLegHead(nil, &ll.req, "127.0.0.1:8001", "rid", len(body))
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(leg) + string(body))))
		require.NoError(t, err, "leg %q of %q", leg, in)
		require.Equal(t, "127.0.0.1:8001", req.Host)
		require.Equal(t, int64(len(body)), req.ContentLength)
		require.Empty(t, req.TransferEncoding)
		require.Equal(t, []string{"rid"}, req.Header.Values("X-Request-Id"))
		for _, k := range []string{HeaderPrefiller, HeaderDataParallel, "Connection", "Keep-Alive", "Te", "Trailer",
			"Upgrade", "Proxy-Authorization", "Proxy-Connection", "Expect", "Accept-Encoding"} {
			require.Empty(t, req.Header.Values(k), "%s forwarded: %q", k, leg)
		}
		got, err := io.ReadAll(req.Body)
		require.NoError(t, err)
		require.Equal(t, string(body), string(got))
		require.False(t, lr.refused)
	})
}
