package multiturnbench

import (
	"math"
	"testing"
	"time"

	"github.com/pd-sidecar/pd-sidecar/e2e/enginesim"
)

func TestPinCostIntegrate(t *testing.T) {
	s := func(at int, held float64, ok bool) sample {
		return sample{at: time.Duration(at) * time.Second, held: held, ok: ok}
	}
	for _, tc := range []struct {
		name                    string
		samples                 []sample
		blockSeconds, peak, end float64
	}{
		{"trapezoids", []sample{s(0, 0, true), s(1, 10, true), s(3, 10, true), s(4, 0, true)}, 5 + 20 + 5, 10, 0},
		{"a failed scrape is a gap bridged by its neighbours", []sample{s(0, 4, true), s(1, 99, false), s(2, 4, true)}, 8, 4, 4},
		{"one sample", []sample{s(0, 7, true)}, 0, 7, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c pinCost
			c.integrate(tc.samples)
			if c.blockSeconds != tc.blockSeconds || c.peak != tc.peak || c.heldAtEnd != tc.end || c.estSeen {
				t.Errorf("got %.1f block·s, peak %.0f, end %.0f, estimate seen %v", c.blockSeconds, c.peak, c.heldAtEnd, c.estSeen)
			}
		})
	}
	var c pinCost
	c.integrate([]sample{{at: 0, ok: true, estimate: 100, estimated: true}, {at: 2 * time.Second, ok: true, estimate: 300, estimated: true}})
	if !c.estSeen || c.estTokenSeconds != 400 || c.estPeak != 300 {
		t.Errorf("estimate: %+v", c)
	}
}

// A pin lives until the next turn's send when that turn pulled it, else to
// its TTL, clipped to the window; never-read pins are classed.
func TestPinCostAttribute(t *testing.T) {
	sec := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
	rec := func(sent, ended float64, history, blocks int) *turnRec {
		return &turnRec{sent: sec(sent), ended: sec(ended), history: history, pinnedBlocks: blocks}
	}
	turns := [][]*turnRec{
		// Read on turn 2 (2 s later); turn 2 is the last turn.
		{rec(0, 1, 0, 10), rec(3, 4, 160, 20)},
		// Abandoned after turn 1.
		{rec(0, 1, 0, 5)},
		// Turn 2 pulled nothing: turn 1's pin was lost; the last turn
		// pinned nothing (no room).
		{rec(0, 1, 0, 10), rec(3, 4, 0, 0)},
	}
	var c pinCost
	c.attribute(turns, []bool{false, true, false}, 10*time.Second, 8*time.Second)
	check := func(name string, got pinShare, n int, bs float64) {
		t.Helper()
		if got.n != n || math.Abs(got.blockSeconds-bs) > 1e-9 {
			t.Errorf("%s: %+v, want %d pins, %.0f block·s", name, got, n, bs)
		}
	}
	check("read", c.read, 1, 10*2)
	check("last", c.last, 1, 20*4)          // 4 s to the window's end at 8 s
	check("abandoned", c.abandoned, 1, 5*7) // 7 s, its TTL ends at 11 s
	check("lost", c.lost, 1, 10*7)
	if c.pins != 4 {
		t.Errorf("%d pins, want 4", c.pins)
	}
	// Past the window: the last turn's pin until 14 s, the others' until 11 s.
	if want := 20*6.0 + 5*3 + 10*3; math.Abs(c.afterEnd-want) > 1e-9 {
		t.Errorf("after the window: %.0f block·s, want %.0f", c.afterEnd, want)
	}
}

func TestApplyLedger(t *testing.T) {
	a, b := &turnRec{id: "a"}, &turnRec{id: "b"}
	byID := map[string]*turnRec{"a": a, "b": b}
	applyLedger([]enginesim.LedgerEntry{
		{RequestID: "a", Leg: "prefill", ComputedTokens: 300, HistoryTokens: 1600},
		{RequestID: "other", Leg: "prefill", ComputedTokens: 9999},
	}, byID)
	applyLedger([]enginesim.LedgerEntry{
		{RequestID: "a", Leg: "decode", PinnedBlocks: 120, PinnedTokens: 1910},
		{RequestID: "b", Leg: "local", ComputedTokens: 2000},
	}, byID)
	if !a.measured || a.computed != 300 || a.history != 1600 || a.pinnedBlocks != 120 || a.pinnedTokens != 1910 {
		t.Errorf("a: %+v", a)
	}
	if !b.measured || b.computed != 2000 {
		t.Errorf("b (the decode engine's own prefill): %+v", b)
	}
}
