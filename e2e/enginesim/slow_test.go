package enginesim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const prefillCompletion = `{"model":"sim-model","prompt":"fault test","max_tokens":1,` + prefillKV + `}`

// timedPost posts body and returns its status and how long the answer took.
func timedPost(t *testing.T, url, body string) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	a := post(t, url, body)
	return a.status, time.Since(start)
}

// TestSlowShare: a seeded share slows exactly the requests its draws pick
// (reproduced here from the same seed), each by at least slow_ms plus its
// jitter draw, and the others not at all.
func TestSlowShare(t *testing.T) {
	cases := []struct {
		name string
		plan Faults
		n    int
	}{
		{"half", Faults{SlowShare: 0.5, SlowMS: 80, SlowSeed: 7}, 40},
		{"half with jitter", Faults{SlowShare: 0.5, SlowMS: 40, SlowJitterMS: 60, SlowSeed: 11}, 30},
		{"a quarter", Faults{SlowShare: 0.25, SlowMS: 80, SlowSeed: 3}, 40},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startSim(t, RoleBoth, nil)
			setFaults(t, s, mustJSON(tc.plan))
			r := newSlowRand(tc.plan.SlowSeed)
			slowed := 0
			for i := 0; i < tc.n; i++ {
				picked, delay := drawSlow(r, tc.plan)
				before := s.kindMetric(t, "sim_faults_injected_total", "slow")
				status, took := timedPost(t, s.url+"/v1/completions", smallCompletion)
				require.Equal(t, 200, status)
				// Whether the engine slowed it is what its fault counter says,
				// on any machine; a slowed one is never faster than its delay.
				moved := s.kindMetric(t, "sim_faults_injected_total", "slow") - before
				if picked {
					slowed++
					assert.Equal(t, 1.0, moved, "request %d was picked: slowed", i)
					assert.GreaterOrEqual(t, took, delay, "request %d was picked: delayed %v", i, delay)
					assert.GreaterOrEqual(t, delay, time.Duration(tc.plan.SlowMS)*time.Millisecond)
				} else {
					assert.Zero(t, moved, "request %d was not picked: not slowed", i)
				}
			}
			want := tc.plan.SlowShare * float64(tc.n)
			assert.InDelta(t, want, float64(slowed), want/2, "about slow_share of the requests are slowed")
			assert.Equal(t, float64(slowed), s.kindMetric(t, "sim_faults_injected_total", "slow"))
		})
	}
}

// TestSlowSeedRepeats: setting the same plan again restarts its draws.
func TestSlowSeedRepeats(t *testing.T) {
	plan := Faults{SlowShare: 0.5, SlowMS: 1, SlowJitterMS: 1000, SlowSeed: 42}
	var b faultBox
	draws := func() []time.Duration {
		b.set(plan)
		var out []time.Duration
		for i := 0; i < 20; i++ {
			a := b.take(legLocal)
			if !a.slowed {
				a.slow = -1
			}
			out = append(out, a.slow)
		}
		return out
	}
	first := draws()
	assert.Equal(t, first, draws())
	assert.Contains(t, first, time.Duration(-1), "some requests are not picked")
}

// TestSlowOnlyPrefill: with only=prefill, prefill legs are slowed and local
// requests are not.
func TestSlowOnlyPrefill(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"slow_share":1,"slow_ms":150,"only":"prefill"}`)
	cases := []struct {
		name string
		body string
		slow bool
	}{
		{"local", smallCompletion, false},
		{"prefill leg", prefillCompletion, true},
		{"local again", smallCompletion, false},
		{"prefill leg again", prefillCompletion, true},
	}
	for _, tc := range cases {
		before := s.kindMetric(t, "sim_faults_injected_total", "slow")
		status, took := timedPost(t, s.url+"/v1/completions", tc.body)
		require.Equal(t, 200, status, tc.name)
		moved := s.kindMetric(t, "sim_faults_injected_total", "slow") - before
		if tc.slow {
			assert.Equal(t, 1.0, moved, "%s: slowed", tc.name)
			assert.GreaterOrEqual(t, took, 150*time.Millisecond, tc.name)
		} else {
			assert.Zero(t, moved, "%s: not slowed", tc.name)
		}
	}
	assert.Equal(t, 2.0, s.kindMetric(t, "sim_faults_injected_total", "slow"))
	assert.Equal(t, 0.0, s.metric(t, "sim_requests_cancelled_total"))
}

// TestSlowTimesCountsSlowedOnly: a request the share does not pick is not a
// matching request, so skip and times count slowed requests only.
func TestSlowTimesCountsSlowedOnly(t *testing.T) {
	plan := Faults{SlowShare: 0.5, SlowMS: 5, SlowSeed: 9, Skip: 1, Times: 3}
	var b faultBox
	b.set(plan)
	r := newSlowRand(plan.SlowSeed)
	picks, slowed := 0, 0
	for i := 0; i < 40; i++ {
		picked, _ := drawSlow(r, plan)
		a := b.take(legLocal)
		if picked {
			picks++
		}
		if a.slowed {
			slowed++
		}
		if picks == 1+plan.Times {
			break
		}
	}
	assert.Equal(t, plan.Times, slowed, "the first pick is skipped, the next three slowed")
	assert.Equal(t, Faults{}, b.get(), "cleared after times slowed requests")
	assert.False(t, b.take(legLocal).slowed)

	// With another fault in the plan, every matching request counts and
	// only the picked ones are slowed.
	b.set(Faults{SlowShare: 0.5, SlowMS: 5, SlowSeed: 9, LatencyMS: 1, Times: 4})
	r = newSlowRand(9)
	for i := 0; i < 4; i++ {
		picked, _ := drawSlow(r, plan)
		a := b.take(legLocal)
		assert.Equal(t, 1, a.LatencyMS, "request %d", i)
		assert.Equal(t, picked, a.slowed, "request %d", i)
	}
	assert.Equal(t, Faults{}, b.get())
}

func TestSlowValidation(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	for _, bad := range []string{
		`{"slow_share":1.5,"slow_ms":10}`,
		`{"slow_share":-0.1,"slow_ms":10}`,
		`{"slow_share":0.5,"slow_ms":-1}`,
		`{"slow_share":0.5,"slow_jitter_ms":-1,"slow_ms":5}`,
		`{"slow_share":0.5}`,
		`{"slow_ms":10}`,
		`{"slow_jitter_ms":10}`,
		`{"slow_seed":3}`,
		`{"slow_share":"half","slow_ms":10}`,
	} {
		a := post(t, s.url+"/sim/faults", bad)
		assert.Equal(t, 400, a.status, bad)
	}
	for _, good := range []string{
		`{"slow_share":0.5,"slow_ms":10}`,
		`{"slow_share":1,"slow_jitter_ms":10,"slow_seed":18446744073709551615}`,
	} {
		a := post(t, s.url+"/sim/faults", good)
		assert.Equal(t, 200, a.status, "%s: %s", good, a.body)
	}
}
