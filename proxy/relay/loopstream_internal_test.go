//go:build linux

package relay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/netloop"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/sserelay"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// TestLoopStreamBackpressure runs a loopStream between two real sockets
// and a client that does not read: the loop must keep what the client
// cannot take, stop reading the engine meanwhile, and, once the client
// reads, deliver every event in order and end the chunked body.
func TestLoopStreamBackpressure(t *testing.T) {
	g, err := netloop.NewGroup(1)
	require.NoError(t, err)
	defer g.Close()
	p := &inference.Proxy{Sidecar: &core.Sidecar{M: metrics.New(prometheus.NewRegistry(), 0), Log: zerolog.Nop()}}
	ctx, cancel := context.WithCancelCause(context.Background())
	r := &core.Request{P: p.Sidecar, Ctx: ctx, Cancel: cancel, API: connectors.APICompletions, Mode: metrics.ModeLocal}

	// The engine answers a stream's head, and its events once the loop has
	// taken the leg over; then, on the same connection, a second request.
	engineLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer engineLn.Close()
	addr := engineLn.Addr().String()
	var accepted atomic.Int32
	engines := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := engineLn.Accept()
			if err != nil {
				return
			}
			if accepted.Add(1) > 1 {
				_ = c.Close() // a second connection: the first was not pooled
				continue
			}
			engines <- c
		}
	}()
	tr := upstream.NewTransport(time.Second, 8, 8)
	defer tr.Close()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	taken := make(chan struct{})
	const events = 40000 // 8 MB: more than the sockets' buffers hold
	go func() {
		engine := <-engines
		defer engine.Close()
		er := bufio.NewReader(engine)
		if _, err := engineRequest(er); err != nil {
			return
		}
		_, _ = engine.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		<-taken
		w := bufio.NewWriter(engine)
		for i := range events {
			ev := fmt.Sprintf("data: {\"choices\":[{\"text\":\"%05d %s\"}]}\n\n", i, strings.Repeat("x", 150))
			_, _ = w.Write(httpbody.AppendChunk(nil, []byte(ev)))
			if i%50 == 0 {
				_ = w.Flush()
			}
		}
		_, _ = w.WriteString(string(httpbody.AppendChunk(nil, []byte("data: [DONE]\n\n"))) + httpbody.LastChunk)
		_ = w.Flush()
		if _, err := engineRequest(er); err != nil {
			return
		}
		_, _ = engine.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
	}()
	leg, err := tr.Stream(context.Background(), addr, postReq(addr, "/v1/completions"), resp)
	require.NoError(t, err)
	require.True(t, leg.Disarm())
	require.Empty(t, leg.Ahead(), "the events come once the loop has the leg")
	leg.DropReader()

	server, client := tcpPair(t)
	var released atomic.Bool
	ls := &LoopStream{R: r, Loop: g.Pick(), Stream: sserelay.Stream{Body: leg.Body()}, Release: func() { released.Store(true) }}
	ls.UFD, _ = netloop.FD(leg.Conn())
	ls.CFD, _ = netloop.FD(server)
	ls.Conns = &LegConns{ls: ls, leg: leg, done: func(bool) { _ = server.Close() }}
	ls.begin()
	close(taken)
	require.Eventually(t, func() bool {
		ls.mu.Lock()
		defer ls.mu.Unlock()
		return len(ls.pending) > 0
	}, 30*time.Second, 5*time.Millisecond, "the client's socket fills and the loop holds the rest")
	assert.Equal(t, 1, ls.Loop.Len(), "the engine is not watched while the client is behind")

	body, err := io.ReadAll(httputil.NewChunkedReader(client))
	require.NoError(t, err, "a well-formed chunked body, ended")
	got := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
	require.Len(t, got, events+1)
	for i := range events {
		require.Contains(t, got[i], fmt.Sprintf("\"%05d ", i), "event %d in order", i)
	}
	assert.Equal(t, "data: [DONE]", got[events])
	assert.Eventually(t, released.Load, 30*time.Second, 5*time.Millisecond, "the request finished")
	assert.Zero(t, ls.Loop.Len())
	again := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(again)
	doCtx, cancelDo := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelDo()
	hold, err := tr.Do(doCtx, addr, postReq(addr, "/v1/completions"), again)
	require.NoError(t, err)
	hold.Release()
	assert.Equal(t, "ok", string(again.Body()))
	assert.Equal(t, int32(1), accepted.Load(), "the engine connection ended cleanly (back to its pool)")
}

// engineRequest reads one request, its body included, as an engine does.
func engineRequest(br *bufio.Reader) (*http.Request, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, req.Body)
	return req, err
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, err = ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return server, client
}

// postReq is a POST of {} to path on addr.
func postReq(addr, path string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(path)
	req.Header.SetHost(addr)
	req.SetBodyString(`{}`)
	return req
}
