package kvrelease

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// fakeDecoder is a decode engine that records the release legs it gets and
// answers each once gate is closed (nil: at once) with status (0: 200).
type fakeDecoder struct {
	mu     sync.Mutex
	bodies []string
	ids    []string
	gate   chan struct{}
	status int
}

func (f *fakeDecoder) serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) {
		f.mu.Lock()
		f.bodies = append(f.bodies, string(rc.PostBody()))
		f.ids = append(f.ids, string(rc.Request.Header.Peek("X-Request-Id")))
		status := f.status
		f.mu.Unlock()
		if f.gate != nil {
			<-f.gate
		}
		if status != 0 {
			rc.SetStatusCode(status)
		}
		rc.SetContentType("application/json")
		rc.SetBodyString(`{"choices":[{"text":"x"}]}`)
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

func (f *fakeDecoder) got() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

const releaseParams = `{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r","remote_block_ids":[[1]],"remote_host":"h","remote_port":1}`

// testReleaser is a nixlv2 releaser that runs until stop, or the end of
// t, and its counts.
func testReleaser(t *testing.T) (kr *Releaser, counts *prometheus.CounterVec, stop func()) {
	t.Helper()
	counts = metrics.New(prometheus.NewRegistry(), 0).KVReleases
	kr = New(DecodeLegs, nixlv2.New(), upstream.NewTransport(time.Second, 64, 4), counts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		kr.Run(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return kr, counts, stop
}

// leg builds a release leg to addr under id: the release body of a
// completion with the handoff of releaseParams.
func leg(addr, id string) func(connectors.KVReleaser) ([]byte, error) {
	return func(conn connectors.KVReleaser) ([]byte, error) {
		body, err := conn.ReleaseBody(nil, connectors.APICompletions,
			[]byte(`{"model":"m","prompt":"hi","max_tokens":9,"stream":true}`), connectors.Handoff{Params: []byte(releaseParams)})
		if err != nil {
			return nil, err
		}
		raw := "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nHost: " + addr +
			"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\nX-Request-Id: " + id + "\r\n\r\n"
		return append([]byte(raw), body...), nil
	}
}

func releases(counts *prometheus.CounterVec, how string) float64 {
	return testutil.ToFloat64(counts.WithLabelValues(how))
}

// TestRelease: a release leg is sent as built and counted by how the
// engine answered it; one that cannot be built is counted failed and sent
// nowhere.
func TestRelease(t *testing.T) {
	tests := []struct {
		name   string
		status int   // the engine's answer (0: 200)
		build  error // the leg cannot be built
		sent   int
		how    string
	}{
		{name: "read by the engine", sent: 1, how: metrics.KVReleaseDecodeLeg},
		{name: "the engine answered an error", status: 500, sent: 1, how: metrics.KVReleaseFailed},
		{name: "no leg for this body", build: errors.New("no release body"), how: metrics.KVReleaseFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeDecoder{status: tc.status}
			local := f.serve(t)
			kr, counts, stop := testReleaser(t)
			build := leg(local, "rid-kv-release")
			if tc.build != nil {
				build = func(connectors.KVReleaser) ([]byte, error) { return nil, tc.build }
			}
			kr.Release(local, zerolog.Nop(), build)
			require.Eventually(t, func() bool { return releases(counts, tc.how) == 1 }, 30*time.Second, 5*time.Millisecond)
			stop()
			require.Equal(t, tc.sent, f.got())
			if tc.sent > 0 {
				assert.Equal(t, "rid-kv-release", f.ids[0])
				assert.Contains(t, f.bodies[0], `"max_tokens":1`)
			}
			assert.Equal(t, 1.0, releases(counts, metrics.KVReleaseDecodeLeg)+releases(counts, metrics.KVReleaseFailed)+
				releases(counts, metrics.KVReleaseOverLimit), "counted once")
			assert.Empty(t, kr.sem, "its place given back")
		})
	}
}

// TestReleaseBounded: past maxInFlight in flight a release is not sent
// (over_limit); stopping cancels those in flight (failed) and waits for
// them; nothing is sent after.
func TestReleaseBounded(t *testing.T) {
	f := &fakeDecoder{gate: make(chan struct{})}
	defer close(f.gate)
	local := f.serve(t)
	kr, counts, stop := testReleaser(t)
	for range maxInFlight + 1 {
		kr.Release(local, zerolog.Nop(), leg(local, "rid-kv-release"))
	}
	assert.Equal(t, 1.0, releases(counts, metrics.KVReleaseOverLimit))
	require.Eventually(t, func() bool { return f.got() == maxInFlight }, 30*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("stop did not end the release legs in flight")
	}
	assert.Equal(t, float64(maxInFlight), releases(counts, metrics.KVReleaseFailed))
	built := false
	kr.Release(local, zerolog.Nop(), func(c connectors.KVReleaser) ([]byte, error) {
		built = true
		return leg(local, "rid-kv-release")(c)
	})
	assert.True(t, built)
	assert.Equal(t, maxInFlight, f.got(), "nothing sent once stopped")
	assert.Empty(t, kr.sem)
}
