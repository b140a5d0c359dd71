package clientconn

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// TestConnCountsRequests checks the measure that keeps a stream from
// moving to an event loop, and a connection from moving to the lane, while
// fasthttp holds bytes read past its request: on a keep-alive connection
// the bytes read equal the bytes fasthttp's parser took exactly when
// nothing was read ahead, whatever the request line's or header lines'
// endings; a request whose size cannot be known (a chunked body) takes the
// connection out of the comparison for good.
func TestConnCountsRequests(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	type seen struct {
		read, consumed int64
		synced         bool
	}
	got := make(chan seen, 16)
	srv := &fasthttp.Server{ReduceMemoryUsage: true, Handler: func(rc *fasthttp.RequestCtx) {
		defer Counted(rc)()
		c := rc.Conn().(*Conn)
		got <- seen{c.read.Load(), c.consumed.Load(), c.Synced()}
	}}
	go func() { _ = srv.Serve(Listener{Listener: ln, Tails: NewTailPool(4096)}) }()
	defer func() { _ = srv.Shutdown() }()

	post := func(path, body string, headers ...string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s",
			path, strings.Join(headers, ""), len(body), body)
	}
	bareLF := "POST /v1/completions HTTP/1.1\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
	tests := []struct {
		name   string
		writes [][]string // requests, in writes
		ahead  []bool     // per request: more was read while it was handled
		lost   bool       // the connection left the comparison
	}{
		{"post with a body", [][]string{{post("/v1/chat/completions", `{"model":"m","stream":true}`, "Content-Type: application/json\r\n")}}, []bool{false}, false},
		{"query and odd header spacing", [][]string{{post("/v1/completions?a=1&b=%20", `{}`, "x-prefiller-host-port:   10.0.0.1:8000  \r\n")}}, []bool{false}, false},
		{"get without a body", [][]string{{"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"}}, []bool{false}, false},
		{"bare LF request line", [][]string{{bareLF}, {post("/v1/completions", `{}`)}}, []bool{false, false}, false},
		{"bare LF everywhere", [][]string{{"POST /v1/completions HTTP/1.1\nHost: x\nContent-Length: 2\r\n\r\n{}"}}, []bool{false}, false},
		{"blank lines before the request line", [][]string{{"\r\n\n\r\n" + post("/v1/completions", `{}`)}}, []bool{false}, false},
		{"request line in two writes", [][]string{{"POST /v1/comp"}, {"letions HTTP/1.1\nHost: x\r\nContent-Length: 2\r\n\r\n{}"}}, []bool{false}, false},
		{"pipelined", [][]string{{post("/v1/completions", `{"a":1}`), post("/v1/completions", `{"b":2}`)}}, []bool{true, false}, false},
		{"pipelined, bare LF and blank lines", [][]string{{bareLF, "\r\n" + bareLF, bareLF}}, []bool{true, true, false}, false},
		{"chunked body", [][]string{{"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"}}, []bool{false}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
			br := bufio.NewReader(conn)
			i := 0
			for _, w := range tc.writes {
				_, err := io.WriteString(conn, strings.Join(w, ""))
				require.NoError(t, err)
				if len(w) == 1 && !strings.Contains(w[0], "\r\n\r\n") {
					continue // a part of a request
				}
				for range w {
					var resp fasthttp.Response
					require.NoError(t, resp.Read(br))
					s := <-got
					switch {
					case tc.lost:
					case tc.ahead[i]:
						assert.Greater(t, s.read, s.consumed, "request %d: the next one is seen as read ahead", i)
					default:
						assert.Equal(t, s.read, s.consumed, "request %d: nothing read ahead", i)
					}
					assert.Equal(t, !tc.lost && !tc.ahead[i], s.synced, "request %d", i)
					i++
				}
			}
			require.Equal(t, len(tc.ahead), i)
		})
	}
}

// TestLineScan: the request line is measured as fasthttp's parser takes
// it, fed whole or a byte at a time.
func TestLineScan(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int // -1: not whole
	}{
		{"POST / HTTP/1.1\r\nHost: x\r\n", 17},
		{"POST / HTTP/1.1\nHost: x\r\n", 16},
		{"\r\n\nPOST / HTTP/1.1\r\n", 20},
		{"\r\r\nx", 3}, // a line of one CR is not blank (fasthttp refuses it)
		{"POST / HTTP/1.1", -1},
		{"\r\n\r\n", -1},
	} {
		for _, step := range []int{len(tc.in), 1} {
			var s lineScan
			s.begin(0, 4096)
			for b := []byte(tc.in); len(b) > 0; b = b[min(step, len(b)):] {
				s.feed(b[:min(step, len(b))])
			}
			n, ok := s.length(0)
			if tc.want < 0 {
				assert.False(t, ok, "%q", tc.in)
				continue
			}
			assert.True(t, ok, "%q", tc.in)
			assert.Equal(t, tc.want, n, "%q by %d", tc.in, step)
		}
	}
	var s lineScan
	s.begin(0, 8)
	s.feed([]byte("\r\n\r\n\r\n\r\nPOST"))
	_, ok := s.length(0)
	assert.False(t, ok, "past the limit")
}

// FuzzWireSize: whatever request bytes a client sends, a head fasthttp's
// server reads is counted as the bytes its parser took, the request line
// measured in any two reads.
func FuzzWireSize(f *testing.F) {
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
	const maxHeaderBytes = 8 << 10 // --max-header-bytes' default: fasthttp's read buffer
	f.Fuzz(func(t *testing.T, in []byte) {
		var norm fasthttp.RequestHeader
		rd := strings.NewReader(string(in))
		br := bufio.NewReaderSize(rd, maxHeaderBytes)
		if norm.Read(br) != nil {
			return
		}
		headLen := len(in) - rd.Len() - br.Buffered()
		cut := len(in) / 3
		var s lineScan
		s.begin(0, maxHeaderBytes)
		s.feed(in[:cut])
		s.feed(in[cut:])
		line, ok := s.length(0)
		require.True(t, ok, "request line of %q", in)
		if n := wireSize(&norm, line, true); n >= 0 {
			require.Equal(t, int64(headLen+max(norm.ContentLength(), 0)), n, "wire size of %q", in)
		}
	})
}

// TestConnReadBy: while a replayed request is read, no read deadline
// fasthttp sets goes past its bound (none, or a later one); once it is
// read, deadlines are as set.
func TestConnReadBy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	s, err := ln.Accept()
	require.NoError(t, err)
	cc := &Conn{TCPConn: s.(*net.TCPConn)}
	defer cc.Close()

	cc.Replay(nil, time.Now().Add(100*time.Millisecond))
	for _, d := range []time.Time{{}, time.Now().Add(time.Hour)} {
		require.NoError(t, cc.SetReadDeadline(d))
		start := time.Now()
		_, err = cc.Read(make([]byte, 1))
		var ne net.Error
		require.ErrorAs(t, err, &ne)
		assert.True(t, ne.Timeout())
		assert.Less(t, time.Since(start), 5*time.Second, "by readBy, not by %v", d)
	}
	cc.readBy.Store(0) // the request is read (Counted)
	// A deadline far past readBy (long gone): the read gets its byte, on
	// any machine.
	require.NoError(t, cc.SetReadDeadline(time.Now().Add(30*time.Second)))
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	n, err := cc.Read(make([]byte, 1))
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}
