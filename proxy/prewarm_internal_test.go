package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/connectors/sglang"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

func TestSeenSet(t *testing.T) {
	type op struct {
		forget bool
		v      string
		isNew  bool // add's answer
	}
	cases := []struct {
		name string
		max  int
		ops  []op
		len  int
	}{
		{"new then known", 3, []op{{v: "a", isNew: true}, {v: "a"}, {v: "b", isNew: true}, {v: "b"}}, 2},
		{"oldest forgotten past max", 2, []op{
			{v: "a", isNew: true}, {v: "b", isNew: true}, {v: "c", isNew: true}, // a out
			{v: "b"}, {v: "a", isNew: true}, // b out
			{v: "c"}, {v: "b", isNew: true},
		}, 2},
		{"forget", 3, []op{
			{v: "a", isNew: true}, {forget: true, v: "a"}, {v: "a", isNew: true},
			{forget: true, v: "zz"}, {v: "b", isNew: true},
		}, 2},
		{"forgotten member's slot is reused", 2, []op{
			{v: "a", isNew: true}, {v: "b", isNew: true}, {forget: true, v: "a"},
			{v: "c", isNew: true}, // slot of a: nothing to delete
			{v: "b"}, {v: "c"},
		}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSeenSet(c.max)
			for i, o := range c.ops {
				if o.forget {
					s.forget(o.v)
					continue
				}
				assert.Equal(t, o.isNew, s.add(o.v), "op %d: add(%s)", i, o.v)
			}
			assert.Equal(t, c.len, s.len())
			assert.LessOrEqual(t, s.len(), c.max)
		})
	}
}

// prewarmProxy is a proxy with --prefill-prewarm on conn, port 8000 and
// POD_IP 10.0.0.5.
func prewarmProxy(t *testing.T, conn connectors.Connector, on bool) *Proxy {
	t.Helper()
	cfg := DefaultConfig()
	cfg.PodIP = "10.0.0.5"
	cfg.DataParallelSize = 2
	cfg.PrefillPrewarm = on
	p, err := New(cfg, conn, metrics.New(prometheus.NewRegistry(), 0), prometheus.NewRegistry(), zerolog.Nop())
	require.NoError(t, err)
	return p
}

func prewarms(p *Proxy, result string) float64 {
	return testutil.ToFloat64(p.m.Prewarms.WithLabelValues(result))
}

func TestPrewarmSightings(t *testing.T) {
	type sight struct {
		hp    string
		fresh bool
		want  sighting
	}
	cases := []struct {
		name    string
		conn    connectors.Connector
		off     bool
		sights  []sight
		skipped float64
	}{
		{"new, then known", nixlv2.New(), false, []sight{
			{hp: "10.0.0.1:8000", want: sightQueued},
			{hp: "10.0.0.1:8000", want: sightKnown},
			{hp: "10.0.0.2:8000", want: sightQueued},
		}, 0},
		{"fresh warms a known one again", nixlv2.New(), false, []sight{
			{hp: "10.0.0.1:8000", want: sightQueued},
			{hp: "10.0.0.1:8000", fresh: true, want: sightQueued},
			{hp: "10.0.0.3:8000", fresh: true, want: sightQueued},
		}, 0},
		{"own addresses skipped once", nixlv2.New(), false, []sight{
			{hp: "10.0.0.5:8000", want: sightSkipped},
			{hp: "10.0.0.5:8000", want: sightKnown},
			{hp: "127.0.0.1:8001", want: sightSkipped}, // rank 1
			{hp: "localhost:8000", want: sightSkipped},
			{hp: "10.0.0.5:8002", want: sightQueued}, // past the ranks
			{hp: "10.0.0.5:8200", want: sightQueued},
		}, 3},
		{"off", nixlv2.New(), true, []sight{{hp: "10.0.0.1:8000", want: sightKnown}}, 0},
		{"connector not covered", sglang.New(8998), false, []sight{{hp: "10.0.0.1:8000", want: sightKnown}}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := prewarmProxy(t, c.conn, !c.off)
			for i, s := range c.sights {
				assert.Equal(t, s.want, p.warm.saw(s.hp, s.fresh), "sighting %d: %s", i, s.hp)
			}
			assert.Equal(t, c.skipped, prewarms(p, metrics.PrewarmSkipped))
		})
	}
}

// TestPrewarmQueueFull: past prewarmQueue waiting warm-ups a new prefiller
// is skipped, counted, and forgotten, so that it is warmed when seen again
// once there is room.
func TestPrewarmQueueFull(t *testing.T) {
	p := prewarmProxy(t, nixlv2.New(), true)
	for i := range prewarmQueue {
		require.Equal(t, sightQueued, p.warm.saw(fmt.Sprintf("10.1.0.%d:8000", i), false))
	}
	assert.Equal(t, sightSkipped, p.warm.saw("10.2.0.1:8000", false))
	assert.Equal(t, 1.0, prewarms(p, metrics.PrewarmSkipped))
	<-p.warm.queue
	assert.Equal(t, sightQueued, p.warm.saw("10.2.0.1:8000", false))
}

// TestPrewarmWorkers: warm-ups run at most prewarmInFlight at once, at
// the limiter's rate, each counted ok or failed; stop ends them.
func TestPrewarmWorkers(t *testing.T) {
	p := prewarmProxy(t, nixlv2.New(), true)
	w := p.warm
	w.limit = rate.NewLimiter(rate.Every(50*time.Millisecond), 1)
	var running, most atomic.Int32
	var mu sync.Mutex
	var order []string
	w.warm = func(ctx context.Context, hp string) error {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		mu.Lock()
		order = append(order, hp)
		mu.Unlock()
		time.Sleep(30 * time.Millisecond)
		if hp == "10.0.0.9:8000" {
			return errors.New("refused")
		}
		return nil
	}
	start := time.Now()
	runBackground(t, w)
	for _, hp := range []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000", "10.0.0.9:8000"} {
		require.Equal(t, sightQueued, w.saw(hp, false))
	}
	require.Eventually(t, func() bool { return prewarms(p, metrics.PrewarmOK)+prewarms(p, metrics.PrewarmFailed) == 5 },
		5*time.Second, 5*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "5 warm-ups at 20/s, burst 1")
	assert.LessOrEqual(t, most.Load(), int32(prewarmInFlight))
	assert.Equal(t, 4.0, prewarms(p, metrics.PrewarmOK))
	assert.Equal(t, 1.0, prewarms(p, metrics.PrewarmFailed))
	assert.Len(t, order, 5)
}

// TestPrewarmStop: the end of Run's context cancels a warm-up in flight,
// and Run waits for it; one cut short is counted neither ok nor failed.
func TestPrewarmStop(t *testing.T) {
	p := prewarmProxy(t, nixlv2.New(), true)
	began := make(chan struct{})
	p.warm.warm = func(ctx context.Context, _ string) error {
		close(began)
		<-ctx.Done()
		return ctx.Err()
	}
	stop := runBackground(t, p.warm)
	p.warm.saw("10.0.0.1:8000", false)
	<-began
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stop did not end the warm-ups")
	}
	assert.Zero(t, prewarms(p, metrics.PrewarmOK)+prewarms(p, metrics.PrewarmFailed))
}

func TestPrewarmBody(t *testing.T) {
	b := prewarmBody(`m"x`, "pd-sidecar-prewarm-1")
	assert.True(t, connectors.IsObject(b), "%s", b)
	pre, err := nixlv2.New().PrefillBody(nil, connectors.APICompletions, b)
	require.NoError(t, err)
	assert.Contains(t, string(pre), `"do_remote_decode":true`)
	assert.Contains(t, string(b), `"model":"m\"x"`)
	assert.Contains(t, string(b), `"max_tokens":1`)
}
