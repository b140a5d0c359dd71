package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/e2e/enginesim"
	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/loadgen"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
)

// TestNoGoroutineLeakAfterLoad drives an in-process proxy with a short
// bench run (local and disaggregated, plus clients that leave mid-stream)
// and checks that once it has shut down no goroutine of its is left.
func TestNoGoroutineLeakAfterLoad(t *testing.T) {
	defer goleak.VerifyNone(t, append(fasthttpHousekeeping(), goleak.IgnoreCurrent())...)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	decode, decodeDone := startSim(t, ctx, enginesim.RoleDecode)
	prefill, prefillDone := startSim(t, ctx, enginesim.RolePrefill)

	cfg := proxy.DefaultConfig()
	cfg.Host = "127.0.0.1"
	cfg.Port = freePort(t)
	cfg.ModelServerPort = decode
	cfg.ShutdownGrace = 5 * time.Second
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, cfg.MaxPrefillers)
	p, err := proxy.New(cfg, nixlv2.New(), m, reg, zerolog.Nop())
	require.NoError(t, err)
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	base := "http://127.0.0.1:" + strconv.Itoa(cfg.Port)
	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 10*time.Second, 10*time.Millisecond)

	w := loadgen.Workload{API: loadgen.APIChat, Model: "sim-model", Stream: true,
		PromptTokens: loadgen.Dist{Min: 32, Max: 64}, OutputTokens: loadgen.Dist{Min: 8, Max: 8}, Distinct: 16}
	targets := []loadgen.Target{
		{Name: "local", URL: base},
		{Name: "pd", URL: base, Prefiller: "127.0.0.1:" + strconv.Itoa(prefill)},
	}
	res, err := loadgen.Run(ctx, w.API, targets, w.Generate(), loadgen.Load{Clients: 4, Duration: 300 * time.Millisecond, Rounds: 1}, nil)
	require.NoError(t, err)
	for _, r := range res {
		s := loadgen.Summarize(r)
		require.Positive(t, s.OK, r.Target.Name)
		require.Empty(t, s.Errors, r.Target.Name)
	}

	// Clients that leave mid-stream.
	for range 10 {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Millisecond)
		req, _ := http.NewRequestWithContext(cctx, http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"long"}],"max_tokens":2000,"stream":true}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			buf := make([]byte, 64)
			_, _ = resp.Body.Read(buf)
			resp.Body.Close()
		}
		ccancel()
	}
	// Streams on an event loop: local and P/D ones served by the lane from
	// their start, and P/D ones whose head came in two writes handed
	// over by fasthttp after streaming 50 ms; one of each read to its end,
	// one of each whose client leaves, and a local one still streaming at
	// shutdown (the drain finishes it).
	longStream := func(tokens int, pd, handOver bool) io.ReadCloser {
		body := `{"model":"sim-model","messages":[{"role":"user","content":"long"}],"max_tokens":` + strconv.Itoa(tokens) + `,"stream":true}`
		if handOver {
			conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(cfg.Port))
			require.NoError(t, err)
			_, err = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\n")
			require.NoError(t, err)
			harness.WaitPeerRead(t, conn, 30*time.Second) // the loop read the request line alone
			_, err = io.WriteString(conn, "Host: x\r\nContent-Type: application/json\r\n"+
				core.HeaderPrefiller+": 127.0.0.1:"+strconv.Itoa(prefill)+"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
			require.NoError(t, err)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			return struct {
				io.Reader
				io.Closer
			}{resp.Body, conn}
		}
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		if pd {
			req.Header.Set(core.HeaderPrefiller, "127.0.0.1:"+strconv.Itoa(prefill))
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return resp.Body
	}
	onLoop := func(n float64) {
		require.Eventually(t, func() bool { return testutil.ToFloat64(m.LoopStreams) == n }, 30*time.Second, time.Millisecond)
	}
	lane := testutil.ToFloat64(m.LoopRequests)
	for _, tc := range []struct{ pd, handOver bool }{{false, false}, {true, false}, {true, true}} {
		// 2,000 tokens, 500 µs apart: a second on the loop, time to see it
		// there on any machine.
		body := longStream(2000, tc.pd, tc.handOver)
		onLoop(1)
		_, err = io.Copy(io.Discard, body)
		require.NoError(t, err)
		body.Close()
		onLoop(0)
		body = longStream(2000, tc.pd, tc.handOver)
		onLoop(1)
		body.Close()
		onLoop(0)
	}
	require.Equal(t, 2.0, testutil.ToFloat64(m.LoopHandoffs), "the P/D streams whose head came in two writes were handed over, none other")
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.LoopRequests) >= lane+4 }, 30*time.Second, time.Millisecond,
		"the local and P/D streams sent whole were the lane's")
	body := longStream(2000, false, false)
	onLoop(1)
	drained := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, body)
		body.Close()
		drained <- err
	}()

	http.DefaultClient.CloseIdleConnections()
	stop()
	require.NoError(t, <-done)
	require.NoError(t, <-drained, "the stream on the loop was drained to its end")
	cancel()
	<-decodeDone // the simulators' servers have wound down
	<-prefillDone
}

// fasthttpHousekeeping ignores fasthttp's housekeeping: idle-connection
// cleaners that sleep out their interval and then end, the server's
// worker-pool cleaner, and the process-wide dialer's DNS cache and Date
// header. Request goroutines (handlers, stream writers, connection
// watchers) are not ignored.
func fasthttpHousekeeping() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*Client).mCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	}
}

// startSim serves an engine simulator until ctx ends; the channel closes
// once it has.
func startSim(t *testing.T, ctx context.Context, role enginesim.Role) (int, <-chan struct{}) {
	t.Helper()
	cfg := enginesim.DefaultConfig()
	cfg.Role = role
	cfg.Port, cfg.KVPort, cfg.BootstrapPort = 0, 0, 0
	cfg.PrefillPerToken, cfg.DecodePerToken = 0, 500*time.Microsecond
	s, err := enginesim.New(cfg, zerolog.Nop())
	require.NoError(t, err)
	ls, err := s.Listen()
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ctx, ls) }()
	t.Cleanup(func() { <-done })
	return ls.HTTP.Addr().(*net.TCPAddr).Port, done
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
