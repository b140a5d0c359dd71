package tailbench

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAtMost(t *testing.T) {
	cases := []struct {
		name             string
		got, base, scale float64
		met              bool
		measured         string
	}{
		{"under the scaled base", 250, 200, 1.3, true, "250 ms vs 1.3 × 200 ms = 260 ms (1.25×)"},
		{"on the limit", 260, 200, 1.3, true, "260 ms vs 1.3 × 200 ms = 260 ms (1.30×)"},
		{"over it", 261, 200, 1.3, false, "261 ms vs 1.3 × 200 ms = 260 ms (1.30×)"},
		{"factor 1", 40.5, 50, 1, true, "40.5 ms vs 50.0 ms (0.81×)"},
		{"no base: never met", 0, 0, 1, false, "0.0 ms vs 0.0 ms (0.00×)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := atMost(1, "b", tc.got, tc.base, tc.scale, "ms")
			assert.Equal(t, tc.met, l.Met)
			assert.Equal(t, tc.measured, l.Measured)
		})
	}
}

func TestWithinNoise(t *testing.T) {
	cases := []struct {
		name     string
		a, b     float64
		rel, abs float64
		want     bool
	}{
		{"equal", 5, 5, 0.15, 2, true},
		{"small and apart by less than abs", 3, 4.9, 0.15, 2, true},
		{"apart by more than abs and rel", 10, 13, 0.15, 2, false},
		{"within rel", 100, 114, 0.15, 2, true},
		{"over rel, under it the other way", 100, 86, 0.15, 2, false},
		{"b zero, a small", 1, 0, 0.15, 2, true},
		{"b zero, a large", 10, 0, 0.15, 2, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, withinNoise(tc.a, tc.b, tc.rel, tc.abs))
		})
	}
}

func TestHedgeAllowance(t *testing.T) {
	assert.InDelta(t, 25.0, hedgeAllowance(150, 0.1, 10), 1e-9)
	assert.InDelta(t, 10.0, hedgeAllowance(0, 0.1, 10), 1e-9)
}

func TestWriteLinesCountsMissed(t *testing.T) {
	var b bytes.Buffer
	missed, err := writeLines(&b, []Line{
		{Scenario: 1, Budget: "a", Measured: "1", Met: true},
		{Scenario: 1, Budget: "b", Measured: "2"},
		{Scenario: 2, Budget: "c", Measured: "3", Info: true},
	})
	require.NoError(t, err)
	assert.Equal(t, 1, missed)
	assert.Contains(t, b.String(), "MISSED")
	assert.Contains(t, b.String(), "(control)")
	assert.Contains(t, b.String(), "1 of 2 budget lines met")
}

func TestOptionsValidate(t *testing.T) {
	require.NoError(t, DefaultOptions().Validate())
	cases := map[string]func(*Options){
		"scenario 6":             func(o *Options) { o.Scenarios = []int{6} },
		"leave after the hold":   func(o *Options) { o.LeaveAfter = o.DecodeHold },
		"no leave share":         func(o *Options) { o.LeaveShare = 0 },
		"lease within the watch": func(o *Options) { o.KVLease = o.LeaveWatch },
		"no rate":                func(o *Options) { o.Rate = 0 },
		"slow share > 1":         func(o *Options) { o.SlowShare = 2 },
		"kv bytes not ×8":        func(o *Options) { o.KVBytesPerToken = 12 },
		"no rounds":              func(o *Options) { o.Rounds = 0 },
	}
	for name, mutate := range cases {
		o := DefaultOptions()
		mutate(&o)
		assert.Error(t, o.Validate(), name)
	}
}
