package prewarm

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

// testWarmer is a warmer whose split cannot be warmed up when covered
// says why, and whose own addresses are own; its count is returned.
func testWarmer(covered string, own ...string) (*Warmer, *prometheus.CounterVec) {
	count := metrics.NewPrewarms(prometheus.NewRegistry())
	w := New(Deps{
		Covered: func() string { return covered },
		Own: func(hp string) bool {
			for _, o := range own {
				if hp == o {
					return true
				}
			}
			return false
		},
		Locals: []string{"127.0.0.1:8200"},
		Count:  count,
		Log:    zerolog.Nop(),
	})
	return w, count
}

func prewarms(count *prometheus.CounterVec, result string) float64 {
	return testutil.ToFloat64(count.WithLabelValues(result))
}

func TestSightings(t *testing.T) {
	type sight struct {
		hp    string
		fresh bool
		want  Sighting
	}
	cases := []struct {
		name    string
		off     bool   // no warmer
		covered string // why the split cannot be warmed up
		own     []string
		sights  []sight
		skipped float64
	}{
		{name: "new, then known", sights: []sight{
			{hp: "10.0.0.1:8000", want: Queued},
			{hp: "10.0.0.1:8000", want: Known},
			{hp: "10.0.0.2:8000", want: Queued},
		}},
		{name: "fresh warms a known one again", sights: []sight{
			{hp: "10.0.0.1:8000", want: Queued},
			{hp: "10.0.0.1:8000", fresh: true, want: Queued},
			{hp: "10.0.0.3:8000", fresh: true, want: Queued},
		}},
		{name: "own addresses skipped once", own: []string{"10.0.0.5:8000", "127.0.0.1:8001"}, sights: []sight{
			{hp: "10.0.0.5:8000", want: Skipped},
			{hp: "10.0.0.5:8000", want: Known},
			{hp: "127.0.0.1:8001", want: Skipped},
			{hp: "10.0.0.5:8002", want: Queued},
		}, skipped: 2},
		{name: "off", off: true, sights: []sight{{hp: "10.0.0.1:8000", want: Known}}},
		{name: "split not covered", covered: "not a prefill then a decode", sights: []sight{{hp: "10.0.0.1:8000", want: Known}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, count := testWarmer(c.covered, c.own...)
			if c.off {
				w = nil
			}
			for i, s := range c.sights {
				assert.Equal(t, s.want, w.Saw(s.hp, s.fresh), "sighting %d: %s", i, s.hp)
			}
			assert.Equal(t, c.skipped, prewarms(count, metrics.PrewarmSkipped))
		})
	}
}

// TestQueueFull: past queueLen waiting warm-ups a new prefiller is
// skipped, counted, and forgotten, so that it is warmed when seen again
// once there is room.
func TestQueueFull(t *testing.T) {
	w, count := testWarmer("")
	for i := range queueLen {
		require.Equal(t, Queued, w.Saw(fmt.Sprintf("10.1.0.%d:8000", i), false))
	}
	assert.Equal(t, Skipped, w.Saw("10.2.0.1:8000", false))
	assert.Equal(t, 1.0, prewarms(count, metrics.PrewarmSkipped))
	<-w.queue
	assert.Equal(t, Queued, w.Saw("10.2.0.1:8000", false))
}

// run runs w as the proxy does, until the returned stop (also run at the
// end of t) cancels it and waits for it.
func run(t *testing.T, w *Warmer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestWorkers: warm-ups run at most inFlight at once, at the limiter's
// rate, each counted ok or failed; stop ends them.
func TestWorkers(t *testing.T) {
	w, count := testWarmer("")
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
	run(t, w)
	for _, hp := range []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000", "10.0.0.9:8000"} {
		require.Equal(t, Queued, w.Saw(hp, false))
	}
	require.Eventually(t, func() bool { return prewarms(count, metrics.PrewarmOK)+prewarms(count, metrics.PrewarmFailed) == 5 },
		5*time.Second, 5*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "5 warm-ups at 20/s, burst 1")
	assert.LessOrEqual(t, most.Load(), int32(inFlight))
	assert.Equal(t, 4.0, prewarms(count, metrics.PrewarmOK))
	assert.Equal(t, 1.0, prewarms(count, metrics.PrewarmFailed))
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, order, 5)
}

// TestStop: the end of Run's context cancels a warm-up in flight, and Run
// waits for it; one cut short is counted neither ok nor failed.
func TestStop(t *testing.T) {
	w, count := testWarmer("")
	began := make(chan struct{})
	w.warm = func(ctx context.Context, _ string) error {
		close(began)
		<-ctx.Done()
		return ctx.Err()
	}
	stop := run(t, w)
	w.Saw("10.0.0.1:8000", false)
	<-began
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stop did not end the warm-ups")
	}
	assert.Zero(t, prewarms(count, metrics.PrewarmOK)+prewarms(count, metrics.PrewarmFailed))
}

// TestRunNotCovered: with a split that cannot be warmed up, Run returns
// at once.
func TestRunNotCovered(t *testing.T) {
	w, _ := testWarmer("MoRI-IO write mode")
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(context.Background())
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
}

func TestClientBody(t *testing.T) {
	b := clientBody(`m"x`, "pd-sidecar-prewarm-1")
	assert.True(t, connectors.IsObject(b), "%s", b)
	pre, err := nixlv2.New().PrefillBody(nil, connectors.APICompletions, b)
	require.NoError(t, err)
	assert.Contains(t, string(pre), `"do_remote_decode":true`)
	assert.Contains(t, string(b), `"model":"m\"x"`)
	assert.Contains(t, string(b), `"max_tokens":1`)
}

// TestSpread: a fresh sighting's warm-up is queued after a wait drawn in
// [0, Spread) (each its own draw); a sighting a request makes is queued at
// once; the waiting count with the queue stays within queueLen.
func TestSpread(t *testing.T) {
	w, count := testWarmer("")
	w.d.Spread = 10 * time.Second
	var waits []time.Duration
	var due []func()
	draws := 0
	w.draw = func(n time.Duration) time.Duration {
		draws++
		require.Equal(t, 10*time.Second, n)
		return time.Duration(draws) * time.Second
	}
	w.after = func(d time.Duration, f func()) { waits = append(waits, d); due = append(due, f) }

	require.Equal(t, Queued, w.Saw("10.0.0.1:8000", true))
	require.Equal(t, Queued, w.Saw("10.0.0.2:8000", true))
	require.Equal(t, Queued, w.Saw("10.0.0.3:8000", false))
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second}, waits, "each fresh sighting waits its own draw")
	assert.Equal(t, 1, len(w.queue), "the request's sighting is queued at once")
	assert.Equal(t, "10.0.0.3:8000", <-w.queue)
	due[1]()
	due[0]()
	assert.Equal(t, "10.0.0.2:8000", <-w.queue, "queued when its wait is over")
	assert.Equal(t, "10.0.0.1:8000", <-w.queue)
	assert.Equal(t, int32(0), w.waiting.Load())

	for i := range queueLen {
		require.Equal(t, Queued, w.Saw(fmt.Sprintf("10.1.0.%d:8000", i), true))
	}
	assert.Equal(t, Skipped, w.Saw("10.2.0.1:8000", true), "past queueLen waiting")
	assert.Equal(t, 1.0, prewarms(count, metrics.PrewarmSkipped))
}
