package hedge

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

func TestHedgeBudget(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget float64
		splits int
		want   int // hedges the budget lets through, one tried after each split
	}{
		{"zero never hedges", 0, 100, 0},
		{"a tenth: the burst, then one in ten", 0.1, 100, burst + 10},
		{"all", 1, 100, 100},
		{"half", 0.5, 40, 10 + 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := metrics.NewHedge(prometheus.NewRegistry())
			h := New(Config{After: time.Second, Budget: tc.budget}, m)
			got := 0
			for range tc.splits {
				_, ok := h.Split("p")
				require.True(t, ok)
				if h.Take() {
					got++
				}
			}
			// The burst refills as splits come: tokens left over are at most
			// the burst's, never more.
			assert.InDelta(t, tc.want, got, 1)
			assert.Equal(t, float64(tc.splits-got), testutil.ToFloat64(m.Denied))
		})
	}
}

func TestHedgePointAuto(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name    string
		after   time.Duration // the floor given with auto
		samples map[string][]time.Duration
		label   string
		want    time.Duration
		ok      bool
	}{
		{name: "too few samples anywhere: no hedge", samples: map[string][]time.Duration{"a": {ms(100), ms(100)}}, label: "a"},
		{name: "the prefiller's 95th percentile", samples: map[string][]time.Duration{"a": spread(100, 200, 100)}, label: "a", want: ms(195), ok: true},
		{name: "a prefiller with few samples: every prefiller's", samples: map[string][]time.Duration{
			"a": spread(100, 200, 100), "b": {ms(900)}}, label: "b", want: ms(196), ok: true},
		{name: "fast prefills: the floor", samples: map[string][]time.Duration{"a": spread(1, 10, 50)}, label: "a", want: AutoFloor, ok: true},
		{name: "a given floor above the percentile", after: ms(300), samples: map[string][]time.Duration{"a": spread(100, 200, 100)}, label: "a", want: ms(300), ok: true},
		{name: "only the recent window counts", samples: map[string][]time.Duration{"a": append(spread(1000, 1000, 200), spread(100, 200, window)...)}, label: "a", want: ms(195), ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := New(Config{Auto: true, After: tc.after, Budget: 0.1}, metrics.NewHedge(prometheus.NewRegistry()))
			for label, ds := range tc.samples {
				for _, d := range ds {
					h.Observe(label, d)
				}
			}
			got, ok := h.Split(tc.label)
			require.Equal(t, tc.ok, ok)
			if ok {
				assert.InDelta(t, tc.want, got, float64(2*time.Millisecond), "hedge point %v", got)
			}
		})
	}
}

// spread is n durations evenly from lo to hi milliseconds.
func spread(lo, hi, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		v := float64(lo)
		if n > 1 {
			v += float64(hi-lo) * float64(i) / float64(n-1)
		}
		out[i] = time.Duration(v * float64(time.Millisecond))
	}
	return out
}

func TestHedgeConfig(t *testing.T) {
	for _, tc := range []struct {
		c   Config
		on  bool
		err bool
	}{
		{c: Config{}, on: false},
		{c: Config{After: time.Second, Budget: 0.1}, on: true},
		{c: Config{Auto: true}, on: true},
		{c: Config{After: -time.Second}, err: true},
		{c: Config{After: time.Second, Budget: 1.5}, on: true, err: true},
		{c: Config{After: time.Second, Budget: -0.1}, on: true, err: true},
	} {
		assert.Equal(t, tc.on, tc.c.On(), "%+v", tc.c)
		assert.Equal(t, tc.err, tc.c.Validate() != nil, "%+v", tc.c)
	}
	assert.Nil(t, New(Config{}, nil), "off: no policy")
}
