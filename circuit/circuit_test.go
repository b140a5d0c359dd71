package circuit

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newBreakers(failures, max int) (*Breakers, *clock) {
	c := &clock{t: time.Unix(1000, 0)}
	return New(Config{Failures: failures, Cooldown: time.Second, MaxTracked: max, Now: c.now}), c
}

func fail(t *testing.T, b *Breakers, key string) {
	t.Helper()
	tk, ok := b.Allow(key)
	require.True(t, ok, key)
	tk.Done(Failure)
}

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	b, c := newBreakers(3, 10)
	fail(t, b, "p")
	fail(t, b, "p")
	tk, ok := b.Allow("p")
	require.True(t, ok)
	tk.Done(Success) // resets the count
	fail(t, b, "p")
	fail(t, b, "p")
	assert.Equal(t, Closed, b.State("p"))
	fail(t, b, "p")
	assert.Equal(t, Open, b.State("p"))
	_, ok = b.Allow("p")
	assert.False(t, ok, "open: skipped")
	_, ok = b.Allow("q")
	assert.True(t, ok, "other prefillers unaffected")

	c.add(time.Second)
	probe, ok := b.Allow("p")
	require.True(t, ok, "cool-down over: one probe")
	assert.Equal(t, HalfOpen, b.State("p"))
	_, ok = b.Allow("p")
	assert.False(t, ok, "only one probe at a time")
	probe.Done(Failure)
	assert.Equal(t, Open, b.State("p"), "failed probe reopens")
	_, ok = b.Allow("p")
	assert.False(t, ok)

	c.add(time.Second)
	probe, ok = b.Allow("p")
	require.True(t, ok)
	probe.Done(Success)
	probe.Done(Failure) // ignored: reported once
	assert.Equal(t, Closed, b.State("p"))
	_, ok = b.Allow("p")
	assert.True(t, ok)
}

func TestBreakerNeutralProbeReleasesSlot(t *testing.T) {
	b, c := newBreakers(1, 10)
	fail(t, b, "p")
	c.add(time.Second)
	probe, ok := b.Allow("p")
	require.True(t, ok)
	probe.Done(Neutral)
	next, ok := b.Allow("p")
	require.True(t, ok, "the next request probes")
	next.Done(Success)
	assert.Equal(t, Closed, b.State("p"))
}

func TestBreakerDisabled(t *testing.T) {
	b, _ := newBreakers(0, 10)
	for range 10 {
		fail(t, b, "p")
	}
	assert.Equal(t, Closed, b.State("p"))
	assert.Zero(t, b.Len())
	var nilB *Breakers
	tk, ok := nilB.Allow("p")
	assert.True(t, ok)
	tk.Done(Failure)
}

func TestBreakerBounded(t *testing.T) {
	b, _ := newBreakers(2, 64)
	for i := range 100_000 {
		fail(t, b, fmt.Sprintf("10.%d.%d.%d:8000", i>>16&255, i>>8&255, i&255))
	}
	assert.LessOrEqual(t, b.Len(), 64)
	// Open circuits are kept over closed ones.
	for i := range 64 {
		k := fmt.Sprintf("dead-%d:1", i)
		fail(t, b, k)
		fail(t, b, k)
	}
	assert.Equal(t, 64, b.Len())
	fail(t, b, "new:1")
	assert.Equal(t, Closed, b.State("new:1"), "untracked when every slot is open")
	assert.Equal(t, Open, b.State("dead-0:1"))
}

func TestBreakerConcurrent(t *testing.T) {
	b, _ := newBreakers(3, 16)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				if tk, ok := b.Allow(fmt.Sprint(i % 32)); ok {
					tk.Done(Result((i + g) % 4))
				}
			}
		})
	}
	wg.Go(func() { // a prober
		for i := range 1000 {
			for _, k := range b.Probes(8) {
				b.Probed(k, i%2 == 0)
			}
		}
	})
	wg.Wait()
	assert.LessOrEqual(t, b.Len(), 16)
}

// open fails key with r until its circuit opens (Failures times).
func open(t *testing.T, b *Breakers, key string, r Result) {
	t.Helper()
	for range b.cfg.Failures {
		tk, ok := b.Allow(key)
		require.True(t, ok, key)
		tk.Done(r)
	}
	require.Equal(t, Open, b.State(key))
}

func TestBreakerProbes(t *testing.T) {
	// A step: a probe's result ("up", "down"), the cool-down passing
	// ("wait"), nothing ("check"), or a request ("ok", "fail",
	// "unreachable", "neutral": the result it reports when admitted);
	// then what holds after it.
	type step struct {
		do     string
		admit  bool // a request: whether it was admitted
		state  State
		listed bool // Probes lists the circuit
	}
	tests := []struct {
		name   string
		opened Result
		steps  []step
	}{
		{"a probe that finds it back admits the trial at once", Unreachable, []step{
			{do: "check", state: Open, listed: true},
			{do: "ok", admit: false, state: Open, listed: true},
			{do: "down", state: Open, listed: true},
			{do: "ok", admit: false, state: Open, listed: true},
			{do: "up", state: Open, listed: false},
			{do: "ok", admit: true, state: Closed, listed: false},
			{do: "ok", admit: true, state: Closed, listed: false},
		}},
		{"timeouts and 5xx are not probed: the port may have accepted all along", Failure, []step{
			{do: "check", state: Open, listed: false},
			{do: "up", state: Open, listed: false},
			{do: "ok", admit: false, state: Open, listed: false},
			{do: "wait", state: Open, listed: false},
			{do: "ok", admit: true, state: Closed, listed: false},
		}},
		{"a failed trial on a probe's word: probes are ignored until the circuit closes", Unreachable, []step{
			{do: "up", state: Open, listed: false},
			{do: "unreachable", admit: true, state: Open, listed: false},
			{do: "up", state: Open, listed: false},
			{do: "ok", admit: false, state: Open, listed: false},
			{do: "wait", state: Open, listed: false},
			{do: "ok", admit: true, state: Closed, listed: false},
		}},
		{"a trial with no verdict keeps the probe's word", Unreachable, []step{
			{do: "up", state: Open, listed: false},
			{do: "neutral", admit: true, state: Open, listed: false},
			{do: "ok", admit: true, state: Closed, listed: false},
		}},
		{"a timed-out trial after the cool-down opens it unprobed", Unreachable, []step{
			{do: "wait", state: Open, listed: true},
			{do: "fail", admit: true, state: Open, listed: false},
			{do: "up", state: Open, listed: false},
			{do: "ok", admit: false, state: Open, listed: false},
		}},
		{"a refused trial after the cool-down keeps it probed", Failure, []step{
			{do: "wait", state: Open, listed: false},
			{do: "unreachable", admit: true, state: Open, listed: true},
			{do: "up", state: Open, listed: false},
			{do: "ok", admit: true, state: Closed, listed: false},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, c := newBreakers(2, 10)
			open(t, b, "p", tc.opened)
			for i, s := range tc.steps {
				switch s.do {
				case "up", "down":
					b.Probed("p", s.do == "up")
				case "wait":
					c.add(time.Second)
				case "check":
				default:
					r := map[string]Result{"ok": Success, "fail": Failure, "unreachable": Unreachable, "neutral": Neutral}[s.do]
					tk, ok := b.Allow("p")
					require.Equal(t, s.admit, ok, "step %d (%s): admitted", i, s.do)
					if ok {
						tk.Done(r)
					}
				}
				assert.Equal(t, s.state, b.State("p"), "step %d (%s): state", i, s.do)
				listed := b.Probes(10)
				assert.Equal(t, s.listed, len(listed) == 1, "step %d (%s): listed %v", i, s.do, listed)
				in := b.Info("p")
				assert.Equal(t, s.listed, in.Probing, "step %d (%s): Info.Probing", i, s.do)
			}
		})
	}
}

func TestBreakerProbeInfoAndBounds(t *testing.T) {
	b, c := newBreakers(1, 100)
	assert.False(t, b.Probed("nobody:1", true), "a closed circuit has nothing to probe")
	assert.Zero(t, b.Len(), "nor is it tracked by a probe")
	for i := range 10 {
		open(t, b, fmt.Sprintf("p%d:1", i), Unreachable)
	}
	assert.Len(t, b.Probes(3), 3, "a round is bounded")
	assert.Len(t, b.Probes(100), 10)
	assert.Empty(t, b.Probes(0))

	c.add(100 * time.Millisecond)
	assert.False(t, b.Probed("p0:1", false))
	in := b.Info("p0:1")
	assert.Equal(t, Info{State: Open, Probing: true, LastProbe: c.now()}, in)
	assert.True(t, b.Probed("p0:1", true))
	in = b.Info("p0:1")
	assert.Equal(t, Info{State: Open, ProbeUp: true, LastProbe: c.now()}, in)

	// A trial in flight (half-open) is not probed, nor changed by a probe.
	c.add(time.Second)
	tk, ok := b.Allow("p1:1")
	require.True(t, ok)
	assert.Equal(t, HalfOpen, b.State("p1:1"))
	assert.NotContains(t, b.Probes(100), "p1:1")
	assert.False(t, b.Probed("p1:1", true))
	tk.Done(Success)
	assert.Equal(t, Info{}, b.Info("p1:1"), "closed: nothing remembered")

	off, _ := newBreakers(0, 10)
	assert.Empty(t, off.Probes(10), "no breaker, nothing to probe")
	var nilB *Breakers
	assert.Empty(t, nilB.Probes(10))
	assert.False(t, nilB.Probed("p", true))
	assert.Equal(t, Info{}, nilB.Info("p"))
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, DefaultConfig().Validate())
	for _, c := range []Config{{Failures: -1, MaxTracked: 1}, {Failures: 1, MaxTracked: 1}, {Failures: 1, Cooldown: 1},
		{Failures: 1, Cooldown: 1, MaxTracked: 1, ProbeInterval: -1}} {
		assert.Error(t, c.Validate(), "%+v", c)
	}
}
