package hostdns

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// fakeDNS is an injected resolver: answers by name, a failure switch, a
// gate that holds lookups, and a count of lookups.
type fakeDNS struct {
	mu      sync.Mutex
	answers map[string][]string
	fail    bool
	gate    chan struct{} // when set, lookups wait on it
	calls   atomic.Int32
}

var errFakeDNS = errors.New("no such host")

func (f *fakeDNS) failing(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = on
}

func (f *fakeDNS) lookup(ctx context.Context, host string) ([]string, error) {
	f.calls.Add(1)
	f.mu.Lock()
	gate, fail, ips := f.gate, f.fail, f.answers[host]
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fail || ips == nil {
		return nil, errFakeDNS
	}
	return ips, nil
}

// waitingResolves counts the goroutines in Resolver.Resolve that wait
// on another caller's lookup (blocked in its select, not in the lookup).
func waitingResolves() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if strings.Contains(header, "[select") && strings.Contains(g, "(*Resolver).Resolve") && !strings.Contains(g, "(*fakeDNS).lookup") {
			n++
		}
	}
	return n
}

// testResolver is a resolver on f with a settable clock.
func testResolver(f *fakeDNS, seed map[string]string) (*Resolver, *metrics.MoriIO, *time.Time) {
	m := metrics.NewMoriIO(prometheus.NewRegistry())
	// A lookup timeout no gated lookup below comes near on any machine.
	r := New(f.lookup, 30*time.Second, 30*time.Second, seed, m, zerolog.Nop())
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	for _, e := range r.byHost {
		e.at = now
	}
	return r, m, &now
}

// run runs r as the proxy does, until the returned stop (also run at the
// end of t) cancels it and waits for it.
func run(t *testing.T, r *Resolver) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
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

func counts(m *metrics.MoriIO) [3]float64 {
	return [3]float64{testutil.ToFloat64(m.DNSReresolve), testutil.ToFloat64(m.DNSIPChanged), testutil.ToFloat64(m.DNSLookupFailures)}
}

func TestPickIP(t *testing.T) {
	f := &fakeDNS{answers: map[string][]string{"v6first": {"fd00::1", "10.0.0.7"}, "v6only": {"fd00::2"}, "none": {}}}
	for _, c := range []struct {
		spec, want string
		err        error
	}{
		{"10.1.2.3", "10.1.2.3", nil}, {"fd00::9", "fd00::9", nil},
		{"v6first", "10.0.0.7", nil}, {"v6only", "fd00::2", nil},
		{"none", "", ErrNoAddress}, {"missing", "", errFakeDNS},
	} {
		got, err := PickIP(context.Background(), f.lookup, c.spec)
		assert.Equal(t, c.want, got, c.spec)
		if c.err != nil {
			assert.ErrorIs(t, err, c.err, c.spec)
		} else {
			assert.NoError(t, err, c.spec)
		}
	}
}

func TestResolver(t *testing.T) {
	t.Run("literal IPs are never looked up", func(t *testing.T) {
		f := &fakeDNS{answers: map[string][]string{}}
		r, m, _ := testResolver(f, nil)
		defer run(t, r)()
		assert.Equal(t, "10.0.0.1", r.Resolve(context.Background(), "10.0.0.1"))
		assert.Zero(t, f.calls.Load())
		assert.Equal(t, [3]float64{}, counts(m))
	})
	t.Run("seeded: fresh within the TTL", func(t *testing.T) {
		f := &fakeDNS{answers: map[string][]string{"svc": {"10.0.0.9"}}}
		r, m, now := testResolver(f, map[string]string{"svc": "10.0.0.1"})
		defer run(t, r)()
		*now = now.Add(29 * time.Second)
		assert.Equal(t, "10.0.0.1", r.Resolve(context.Background(), "svc"))
		assert.Zero(t, f.calls.Load())
		assert.Equal(t, [3]float64{}, counts(m))
	})
	t.Run("stale: served at once, revalidated once in the background", func(t *testing.T) {
		f := &fakeDNS{answers: map[string][]string{"svc": {"10.0.0.9"}}, gate: make(chan struct{})}
		r, m, now := testResolver(f, map[string]string{"svc": "10.0.0.1"})
		defer run(t, r)()
		*now = now.Add(31 * time.Second)
		for range 5 {
			assert.Equal(t, "10.0.0.1", r.Resolve(context.Background(), "svc"), "stale while revalidating")
		}
		close(f.gate)
		require.Eventually(t, func() bool { return r.Resolve(context.Background(), "svc") == "10.0.0.9" }, 30*time.Second, time.Millisecond)
		assert.Equal(t, int32(1), f.calls.Load(), "one background lookup")
		assert.Equal(t, [3]float64{1, 1, 0}, counts(m))
	})
	t.Run("stale and the lookup fails: the stale address is kept and the failure counted", func(t *testing.T) {
		f := &fakeDNS{answers: map[string][]string{}}
		f.failing(true)
		r, m, now := testResolver(f, map[string]string{"svc": "10.0.0.1"})
		defer run(t, r)()
		*now = now.Add(31 * time.Second)
		assert.Equal(t, "10.0.0.1", r.Resolve(context.Background(), "svc"))
		require.Eventually(t, func() bool { return counts(m)[2] == 1 }, 30*time.Second, time.Millisecond)
		assert.Equal(t, "10.0.0.1", r.Resolve(context.Background(), "svc"), "fresh again for a TTL after the failure")
		assert.Equal(t, int32(1), f.calls.Load())
		assert.Equal(t, [3]float64{1, 0, 1}, counts(m))
	})
	t.Run("cold: looked up once for concurrent callers", func(t *testing.T) {
		f := &fakeDNS{answers: map[string][]string{"svc": {"10.0.0.5"}}, gate: make(chan struct{})}
		r, m, _ := testResolver(f, nil)
		defer run(t, r)()
		var wg sync.WaitGroup
		got := make([]string, 8)
		for i := range got {
			wg.Go(func() { got[i] = r.Resolve(context.Background(), "svc") })
		}
		require.Eventually(t, func() bool { return f.calls.Load() == 1 }, 30*time.Second, time.Millisecond)
		// Every other caller is waiting on the one lookup before it ends.
		require.Eventually(t, func() bool { return waitingResolves() == len(got)-1 }, 30*time.Second, time.Millisecond,
			"the other callers wait on the lookup")
		close(f.gate)
		wg.Wait()
		for _, g := range got {
			assert.Equal(t, "10.0.0.5", g)
		}
		assert.Equal(t, int32(1), f.calls.Load(), "singleflight")
		assert.Equal(t, [3]float64{1, 0, 0}, counts(m))
	})
	t.Run("cold and the lookup fails: the raw spec", func(t *testing.T) {
		f := &fakeDNS{answers: map[string][]string{}}
		r, m, _ := testResolver(f, nil)
		defer run(t, r)()
		assert.Equal(t, "svc", r.Resolve(context.Background(), "svc"))
		assert.Equal(t, [3]float64{1, 0, 1}, counts(m))
	})
	t.Run("a lookup is bounded by the timeout", func(t *testing.T) {
		f := &fakeDNS{answers: map[string][]string{"svc": {"10.0.0.5"}}, gate: make(chan struct{})}
		m := metrics.NewMoriIO(prometheus.NewRegistry())
		r := New(f.lookup, time.Minute, 50*time.Millisecond, nil, m, zerolog.Nop())
		defer run(t, r)()
		start := time.Now()
		assert.Equal(t, "svc", r.Resolve(context.Background(), "svc"))
		took := time.Since(start)
		assert.GreaterOrEqual(t, took, 50*time.Millisecond, "not before the timeout")
		assert.Less(t, took, 50*time.Millisecond+10*time.Second, "by the timeout: the lookup never answers")
		assert.Equal(t, [3]float64{1, 0, 1}, counts(m))
	})
}

func TestResolverReady(t *testing.T) {
	f := &fakeDNS{answers: map[string][]string{"svc": {"10.0.0.5"}, "other": {"10.0.0.6"}}}
	f.failing(true)
	r, _, now := testResolver(f, map[string]string{"seeded": "10.0.0.1"})
	defer run(t, r)()
	for _, c := range []struct {
		name  string
		specs []string
		want  bool
	}{
		{"nothing to resolve", nil, true},
		{"empty and literal specs", []string{"", "10.0.0.2", "fd00::1"}, true},
		{"seeded", []string{"seeded", "10.0.0.2"}, true},
		{"never looked up", []string{"seeded", "svc"}, false},
	} {
		assert.Equal(t, c.want, r.Ready(c.specs...), c.name)
	}
	assert.Zero(t, f.calls.Load(), "Ready looks nothing up")

	assert.Equal(t, "svc", r.Resolve(context.Background(), "svc"), "a failed cold lookup: the raw spec")
	assert.False(t, r.Ready("svc"), "a spec whose lookup failed has no address yet")
	f.failing(false)
	*now = now.Add(time.Second)
	assert.Equal(t, "10.0.0.5", r.Resolve(context.Background(), "svc"))
	assert.True(t, r.Ready("svc", "seeded"), "resolved")
	f.failing(true)
	*now = now.Add(time.Minute) // stale, and its revalidation fails
	assert.Equal(t, "10.0.0.5", r.Resolve(context.Background(), "svc"))
	require.Eventually(t, func() bool { return f.calls.Load() == 3 }, 30*time.Second, time.Millisecond)
	assert.True(t, r.Ready("svc"), "an address once had stays through failed lookups")
	assert.False(t, r.Ready("other"))
}
