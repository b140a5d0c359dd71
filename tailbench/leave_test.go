package tailbench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// heldSeries builds samples every 100 ms from ref on, one per value.
func heldSeries(ref time.Time, held ...float64) []blockSample {
	out := make([]blockSample, len(held))
	for i, v := range held {
		out[i] = blockSample{at: ref.Add(time.Duration(i) * 100 * time.Millisecond), held: v}
	}
	return out
}

func TestSettled(t *testing.T) {
	ref := time.Unix(1000, 0)
	ms := time.Millisecond
	cases := []struct {
		name  string
		held  []float64
		after time.Duration
		ok    bool
	}{
		{"none", nil, 0, false},
		{"0 from the first sample", []float64{0, 0, 0}, 0, true},
		{"drains to 0", []float64{40, 20, 0, 0}, 200 * ms, true},
		{"a 0 before the end does not count", []float64{10, 0, 5, 0}, 300 * ms, true},
		{"still held at the end", []float64{40, 20, 20}, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			after, ok := settled(heldSeries(ref, tc.held...), ref)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.after, after)
		})
	}
	// Samples before ref: back to 0 before the load's end reads 0.
	after, ok := settled(heldSeries(ref.Add(-time.Second), 5, 0, 0), ref)
	assert.True(t, ok)
	assert.Zero(t, after)
}

func TestHeldAtAndPeak(t *testing.T) {
	ref := time.Unix(1000, 0)
	s := heldSeries(ref, 3, 9, 4)
	assert.Equal(t, 0.0, heldAt(s, ref.Add(-time.Millisecond)), "before the first sample")
	assert.Equal(t, 9.0, heldAt(s, ref.Add(150*time.Millisecond)), "the last sample at or before")
	assert.Equal(t, 4.0, heldAt(s, ref.Add(time.Hour)))
	assert.Equal(t, 9.0, peak(s))
	assert.Equal(t, blockSample{}, last(nil))
}

// leaveCase builds the two runs of a healthy scenario 5: 300 requests, 30
// clients left before any output, 4 tokens an answer; release on freed
// everything 650 ms after the load's end, release off holds 510 blocks (30
// holds) at the end of its 2 s watch.
func leaveCase() (Options, leaveRun, leaveRun) {
	o := DefaultOptions()
	ref := time.Unix(1000, 0)
	sum := loadgen.Summary{Requests: 300, OK: 270, Left: 30}
	on := leaveRun{release: true, sum: sum, clientTokens: 1080, arrivalsEnd: ref,
		samples:  heldSeries(ref, 270, 170, 50, 20, 20, 20, 20, 0),
		releases: 30, genTokens: 1110, holds: 300, pulls: 300}
	off := leaveRun{sum: sum, clientTokens: 1080, arrivalsEnd: ref,
		samples:   append(heldSeries(ref, 680, 600), blockSample{at: ref.Add(o.LeaveWatch), held: 510}),
		genTokens: 1080, holds: 300, pulls: 270}
	return o, on, off
}

func TestLeaveLines(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(on, off *leaveRun)
		met    []bool // the four lines' verdicts
	}{
		{"healthy", func(on, off *leaveRun) {}, []bool{true, true, true, true}},
		{"release on still holds at the end of its watch", func(on, off *leaveRun) {
			on.samples = heldSeries(on.arrivalsEnd, 270, 170, 51)
		}, []bool{false, true, true, true}},
		{"release on back to 0 only after 1 s", func(on, off *leaveRun) {
			on.samples = heldSeries(on.arrivalsEnd, 270, 170, 50, 50, 50, 50, 50, 50, 50, 50, 50, 0)
		}, []bool{false, true, true, true}},
		{"the control holds nothing: no client left inside the window", func(on, off *leaveRun) {
			off.samples[len(off.samples)-1].held = 0
		}, []bool{false, true, true, true}},
		{"the control's watch ended early", func(on, off *leaveRun) {
			off.samples = off.samples[:2]
		}, []bool{false, true, true, true}},
		{"a release fewer than clients that left", func(on, off *leaveRun) {
			on.releases, on.genTokens = 29, 1109
		}, []bool{true, false, true, true}},
		{"a release over the limit", func(on, off *leaveRun) {
			on.releases, on.releaseOverLimit, on.genTokens, on.pulls = 29, 1, 1109, 299
		}, []bool{true, false, true, true}},
		{"a client left after output began", func(on, off *leaveRun) {
			on.sum.LeftAfterHead = 1
		}, []bool{true, false, true, true}},
		{"the control sent a release", func(on, off *leaveRun) {
			off.releases = 1
		}, []bool{true, false, true, true}},
		{"the control strands fewer holds than clients left", func(on, off *leaveRun) {
			off.pulls = 271
		}, []bool{true, false, true, true}},
		{"a failed release leg that made its token: within the bound", func(on, off *leaveRun) {
			on.releases, on.releaseFailed = 29, 1
		}, []bool{true, false, true, true}},
		{"a duplicate token", func(on, off *leaveRun) {
			on.genTokens = 1111
		}, []bool{true, true, false, true}},
		{"fewer tokens made than the clients got", func(on, off *leaveRun) {
			on.genTokens = 1079
		}, []bool{true, true, false, true}},
		{"the control made a token nobody got", func(on, off *leaveRun) {
			off.genTokens = 1081
		}, []bool{true, true, false, true}},
		{"a request that did not leave failed", func(on, off *leaveRun) {
			off.sum.OK = 269
		}, []bool{true, true, true, false}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, on, off := leaveCase()
			tc.mutate(&on, &off)
			lines := leaveLines(o, on, off)
			met := make([]bool, len(lines))
			for i, l := range lines {
				met[i] = l.Met
				assert.Equal(t, 5, l.Scenario)
				assert.False(t, l.Info)
			}
			assert.Equal(t, tc.met, met)
		})
	}
	o, on, off := leaveCase()
	lines := leaveLines(o, on, off)
	assert.Equal(t, "10 % of clients leave right after the prefill: sim_kv_blocks_held back to 0 within 1 s of the load's end with release on (instead of minutes)", lines[0].Budget)
	assert.Equal(t, "release on: 0 blocks 700 ms after it (270 held at the load's end); off: 510 blocks still held after 2.0 s (the KV of 30 requests), kept until the 480s lease", lines[0].Measured)
	assert.Equal(t, "clients that left: 30 (0 after output began); 30 decode_leg, 0 failed, 0 over_limit, holds stranded 0; release off: clients that left 30, releases 0, holds stranded 30", lines[1].Measured)
	assert.Equal(t, "1110 = 1080 + 30 for 30 release legs; release off: 1080 = 1080", lines[2].Measured)
}

func TestNth(t *testing.T) {
	for share, want := range map[float64]string{0.1: "10th", 0.5: "2nd", 1: "every", 1.0 / 3: "3rd", 1.0 / 12: "12th", 0.05: "20th", 0: "no"} {
		assert.Equal(t, want, nth(share), "%v", share)
	}
}
