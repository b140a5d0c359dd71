//go:build linux

package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http/httputil"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/netloop"
)

// TestLoopStreamBackpressure runs a loopStream between two real sockets
// and a client that does not read: the loop must keep what the client
// cannot take, stop reading the engine meanwhile, and, once the client
// reads, deliver every event in order and end the chunked body.
func TestLoopStreamBackpressure(t *testing.T) {
	g, err := netloop.NewGroup(1)
	require.NoError(t, err)
	defer g.Close()
	p := &Proxy{m: metrics.New(prometheus.NewRegistry(), 0), log: zerolog.Nop()}
	ctx, cancel := context.WithCancelCause(context.Background())
	r := &request{p: p, ctx: ctx, cancel: cancel, api: connectors.APICompletions, mode: metrics.ModeLocal}

	upstream, engine := tcpPair(t)
	server, client := tcpPair(t)
	var clean, released atomic.Bool
	leg := &Leg{conn: upstream, body: httpbody.New(httpbody.Chunked, 0), release: func(c bool) { clean.Store(c) }}
	ls := &loopStream{r: r, loop: g.Pick(), body: leg.Body(), release: func() { released.Store(true) }}
	ls.ufd, _ = netloop.FD(upstream)
	ls.cfd, _ = netloop.FD(server)
	ls.conns = &legConns{ls: ls, leg: leg, done: func(bool) { _ = server.Close() }}
	ls.begin()

	const events = 40000 // 8 MB: more than the sockets' buffers hold
	go func() {
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
	}()
	require.Eventually(t, func() bool {
		ls.mu.Lock()
		defer ls.mu.Unlock()
		return len(ls.pending) > 0
	}, 30*time.Second, 5*time.Millisecond, "the client's socket fills and the loop holds the rest")
	assert.Equal(t, 1, ls.loop.Len(), "the engine is not watched while the client is behind")

	body, err := io.ReadAll(httputil.NewChunkedReader(client))
	require.NoError(t, err, "a well-formed chunked body, ended")
	got := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
	require.Len(t, got, events+1)
	for i := range events {
		require.Contains(t, got[i], fmt.Sprintf("\"%05d ", i), "event %d in order", i)
	}
	assert.Equal(t, "data: [DONE]", got[events])
	assert.Eventually(t, released.Load, 30*time.Second, 5*time.Millisecond, "the request finished")
	assert.True(t, clean.Load(), "the engine connection ended cleanly (back to its pool)")
	assert.Zero(t, ls.loop.Len())
}
