package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// TestClientConnCountsRequests checks the measure that keeps a stream from
// moving to an event loop while fasthttp holds bytes read past its request:
// on a keep-alive connection the bytes read equal the requests' wire sizes
// exactly when nothing was read ahead.
func TestClientConnCountsRequests(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	type seen struct{ read, consumed int64 }
	got := make(chan seen, 16)
	srv := &fasthttp.Server{ReduceMemoryUsage: true, Handler: func(rc *fasthttp.RequestCtx) {
		counted(rc)
		c := rc.Conn().(*clientConn)
		got <- seen{c.read.Load(), c.consumed.Load()}
	}}
	go func() { _ = srv.Serve(clientListener{Listener: ln}) }()
	defer func() { _ = srv.Shutdown() }()

	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	br := bufio.NewReader(conn)
	exchange := func(reqs ...string) []seen {
		_, err := io.WriteString(conn, strings.Join(reqs, ""))
		require.NoError(t, err)
		var out []seen
		for range reqs {
			var resp fasthttp.Response
			require.NoError(t, resp.Read(br))
			out = append(out, <-got)
		}
		return out
	}
	post := func(path, body string, headers ...string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s",
			path, strings.Join(headers, ""), len(body), body)
	}
	tests := []struct {
		name string
		req  string
	}{
		{"post with a body", post("/v1/chat/completions", `{"model":"m","stream":true}`, "Content-Type: application/json\r\n")},
		{"query and odd header spacing", post("/v1/completions?a=1&b=%20", `{}`, "x-prefiller-host-port:   10.0.0.1:8000  \r\n")},
		{"get without a body", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"},
	}
	for _, tc := range tests {
		s := exchange(tc.req)[0]
		assert.Equal(t, s.read, s.consumed, "%s: nothing read ahead", tc.name)
	}
	// Two requests in one write: while the first is handled, the second is
	// already read.
	s := exchange(post("/v1/completions", `{"a":1}`), post("/v1/completions", `{"b":2}`))
	assert.Greater(t, s[0].read, s[0].consumed, "the pipelined request is seen as read ahead")
	assert.Equal(t, s[1].read, s[1].consumed, "and accounted for once handled")
}
