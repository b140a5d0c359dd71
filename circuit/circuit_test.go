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
					tk.Done(Result((i + g) % 3))
				}
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, b.Len(), 16)
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, DefaultConfig().Validate())
	for _, c := range []Config{{Failures: -1, MaxTracked: 1}, {Failures: 1, MaxTracked: 1}, {Failures: 1, Cooldown: 1}} {
		assert.Error(t, c.Validate(), "%+v", c)
	}
}
