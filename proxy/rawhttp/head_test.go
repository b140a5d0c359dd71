package rawhttp_test

import (
	"bufio"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

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
		{"data-parallel rank: the lane's (it picks the rank)", "X-Data-Parallel-HOST-Port: 10.0.0.1:8001\r\n", false, true, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := parseRequestHead(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"+tc.headers+"Content-Length: 2\r\n\r\n")
			lr := rawhttp.ScanRequest(h)
			assert.Equal(t, tc.refused, lr.Refused)
			assert.Equal(t, tc.keep, lr.KeepAlive)
			assert.Equal(t, tc.id, string(lr.ID))
			assert.Equal(t, tc.prefiller, string(lr.Prefiller))
		})
	}
}

// TestScanRequestEncoders: x-encoder-hosts-ports (as long as
// x-prefiller-host-port) is seen in any letter case, without taking the
// prefiller's place, and a leg's head never carries it.
func TestScanRequestEncoders(t *testing.T) {
	for _, tc := range []struct {
		name, headers string
		encoders      bool
		prefiller     string
	}{
		{"none", "Content-Type: application/json\r\n", false, ""},
		{"encoders, any case", "X-Encoder-HOSTS-Ports: 10.0.0.1:8000\r\n", true, ""},
		{"encoders and prefiller", "x-encoder-hosts-ports: e:1\r\nx-prefiller-host-port: p:2\r\n", true, "p:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := parseRequestHead(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+tc.headers+"Content-Length: 2\r\n\r\n")
			lr := rawhttp.ScanRequest(h)
			assert.Equal(t, tc.encoders, lr.Encoders)
			assert.False(t, lr.Refused, "refused only while the stage is on (the caller's check)")
			assert.Equal(t, tc.prefiller, string(lr.Prefiller))
			assert.NotContains(t, strings.ToLower(string(rawhttp.AppendLegHead(nil, h, "127.0.0.1:1", "rid", 2))), rawhttp.HeaderEncoders)
		})
	}
}

// TestAppendLegHead: the leg keeps the client's end-to-end headers and
// drops, in any letter case, the hop-by-hop ones, the sidecar's own and
// those the sidecar sets itself, as the fasthttp path's legs do.
func TestAppendLegHead(t *testing.T) {
	h := parseRequestHead(t, "POST /v1/chat/completions?x=1 HTTP/1.1\r\n"+
		"Host: sidecar:8000\r\nContent-Type: application/json\r\nUser-Agent: ua\r\nAuthorization: Bearer t\r\n"+
		"X-Custom: a\r\nx-custom: b\r\nconnection: keep-alive\r\nKEEP-ALIVE: timeout=5\r\nTE: trailers\r\n"+
		"Proxy-Authorization: p\r\nx-data-parallel-host-port: 10.0.0.2:8000\r\nAccept-Encoding: gzip\r\n"+
		"x-request-id: client-id\r\nContent-Length: 2\r\n\r\n")
	got := string(rawhttp.AppendLegHead(nil, h, "127.0.0.1:8001", "rid", 2))
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
			got := string(rawhttp.AppendAnswerHead(nil, parse(tc.head), "rid", tc.contentLength, tc.keepAlive))
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
