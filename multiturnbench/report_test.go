package multiturnbench

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	mr := &modeResult{turns: []turnData{
		{newTokens: []int{100, 300}, ttft: []time.Duration{50 * time.Millisecond, 10 * time.Millisecond}, computed: 400, decoderComputed: 0, uses: 0, misses: 2},
		{newTokens: []int{200, 200}, ttft: []time.Duration{30 * time.Millisecond, 70 * time.Millisecond}, computed: 1000, decoderComputed: 20, uses: 2},
		{newTokens: []int{50, 150}, ttft: []time.Duration{90 * time.Millisecond, 20 * time.Millisecond}, computed: 210, uses: 2},
	}}
	s := summarize(mr)
	want := []turnSummary{
		{Turn: 1, NewTokens: 200, Computed: 200, TTFT: 30 * time.Millisecond, Misses: 2},
		{Turn: 2, NewTokens: 200, Computed: 500, DecoderComputed: 10, TTFT: 50 * time.Millisecond, Uses: 2},
		{Turn: 3, NewTokens: 100, Computed: 105, TTFT: 55 * time.Millisecond, Uses: 2},
	}
	if len(s.Turns) != len(want) {
		t.Fatalf("got %d turns", len(s.Turns))
	}
	for i := range want {
		if s.Turns[i] != want[i] {
			t.Errorf("turn %d: got %+v, want %+v", i+1, s.Turns[i], want[i])
		}
	}
	// Turns 2 and 3 pooled: 20, 30, 70, 90 ms.
	if s.LaterTTFT != 50*time.Millisecond {
		t.Errorf("pooled TTFT p50 of turns 2-3: %v, want 50ms", s.LaterTTFT)
	}
}

func TestBudgetLines(t *testing.T) {
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	turn := func(n int, newTok, computed float64, ttft int) turnSummary {
		return turnSummary{Turn: n, NewTokens: newTok, Computed: computed, TTFT: ms(ttft)}
	}
	baseline := &modeSummary{Turns: []turnSummary{
		turn(1, 2000, 2000, 100), turn(2, 2500, 4500, 230), turn(3, 2500, 7000, 350),
	}, LaterTTFT: ms(300)}
	for _, tc := range []struct {
		name          string
		without, with *modeSummary
		want          []string // verdicts: computed, TTFT, turn 1
		measured      []string // a piece of each line's measured text
	}{{
		name:    "every budget met",
		without: baseline,
		with: &modeSummary{Turns: []turnSummary{
			turn(1, 2000, 2000, 104), turn(2, 2500, 2300, 140), turn(3, 2500, 2740, 125),
		}, LaterTTFT: ms(130)},
		want:     []string{Pass, Pass, Pass},
		measured: []string{"worst turn 3: 2740 computed / 2500 new = 1.10×", "130 ms vs 300 ms = 0.43× (worst turn 2: 0.61×)", "computed 2000 vs 2000"},
	}, {
		name:    "history not used: computed and TTFT over budget",
		without: baseline,
		with: &modeSummary{Turns: []turnSummary{
			turn(1, 2000, 2000, 100), turn(2, 2500, 4500, 228), turn(3, 2500, 7000, 351),
		}, LaterTTFT: ms(290)},
		want:     []string{Fail, Fail, Pass},
		measured: []string{"= 2.80×", "= 0.97×", "(1.00×)"},
	}, {
		name:    "turn 1 outside noise: slower by more than 20 % and 20 ms",
		without: baseline,
		with: &modeSummary{Turns: []turnSummary{
			turn(1, 2000, 2000, 160), turn(2, 2500, 2500, 100), turn(3, 2500, 2500, 100),
		}, LaterTTFT: ms(100)},
		want: []string{Pass, Pass, Fail},
	}, {
		name:    "turn 1 within 20 ms at a short TTFT",
		without: &modeSummary{Turns: []turnSummary{turn(1, 100, 100, 10), turn(2, 100, 200, 20)}, LaterTTFT: ms(20)},
		with:    &modeSummary{Turns: []turnSummary{turn(1, 100, 100, 25), turn(2, 100, 100, 10)}, LaterTTFT: ms(10)},
		want:    []string{Pass, Pass, Pass},
	}, {
		name:    "turn 1 computed differs",
		without: baseline,
		with: &modeSummary{Turns: []turnSummary{
			turn(1, 2000, 1500, 100), turn(2, 2500, 2500, 100), turn(3, 2500, 2500, 100),
		}, LaterTTFT: ms(100)},
		want: []string{Pass, Pass, Fail},
	}, {
		name:     "without mode alone",
		without:  baseline,
		want:     []string{NA, NA, NA},
		measured: []string{"with mode not run", "needs both modes", "needs both modes"},
	}, {
		name: "with mode alone: its own budget is judged",
		with: &modeSummary{Turns: []turnSummary{
			turn(1, 2000, 2000, 100), turn(2, 2500, 2600, 140),
		}, LaterTTFT: ms(140)},
		want: []string{Pass, NA, NA},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			lines := budgetLines(tc.without, tc.with)
			if len(lines) != len(tc.want) {
				t.Fatalf("%d lines, want %d", len(lines), len(tc.want))
			}
			for i, l := range lines {
				if l.Verdict != tc.want[i] {
					t.Errorf("line %d (%s): %s (%s), want %s", i+1, l.Budget, l.Verdict, l.Measured, tc.want[i])
				}
				if i < len(tc.measured) && !strings.Contains(l.Measured, tc.measured[i]) {
					t.Errorf("line %d measured %q, want it to hold %q", i+1, l.Measured, tc.measured[i])
				}
			}
		})
	}
}

func TestIdenticalAnswers(t *testing.T) {
	a := &modeResult{answers: [][]string{{" a", " b"}, {" c", " d"}}}
	b := &modeResult{answers: [][]string{{" a", " x"}, {" c", " d"}}}
	if same, total := identicalAnswers(a, b); same != 3 || total != 4 {
		t.Errorf("got %d of %d, want 3 of 4", same, total)
	}
}

// The report prints a row per turn, the with mode's counters and the budget
// table with its count.
func TestReportWrite(t *testing.T) {
	o := DefaultOptions()
	o.Conversations, o.Turns = 2, 2
	td := func(computed float64, ttft time.Duration, uses float64) turnData {
		return turnData{newTokens: []int{100, 100}, ttft: []time.Duration{ttft, ttft}, computed: computed, uses: uses}
	}
	without := &modeResult{mode: ModeWithout, turns: []turnData{td(200, 10*time.Millisecond, 0), td(400, 40*time.Millisecond, 0)}}
	with := &modeResult{mode: ModeWith, turns: []turnData{td(200, 10*time.Millisecond, 0), td(210, 12*time.Millisecond, 2)},
		uses: 2, reused: 220, misses: map[string]float64{"no_entry": 2}, pulls: 2, blocksPulled: 12, pins: 4, sidecarMetricsSeen: true}
	var out bytes.Buffer
	if err := buildReport(o, []*modeResult{without, with}).write(&out); err != nil {
		t.Fatal(err)
	}
	// Rows: turn, new tokens, computed without, computed with, with/new,
	// TTFT p50 without, with, and their ratio, uses, misses.
	for _, row := range []string{
		`(?m)^\s*1\s+100\s+100\s+100\s+1\.00\s+10\.0 ms\s+10\.0 ms\s+1\.00×\s+0\s+0\s*$`,
		`(?m)^\s*2\s+100\s+200\s+105\s+1\.05\s+40\.0 ms\s+12\.0 ms\s+0\.30×\s+2\s+0\s*$`,
	} {
		if !regexp.MustCompile(row).MatchString(out.String()) {
			t.Errorf("report lacks a row matching %s:\n%s", row, out.String())
		}
	}
	for _, want := range []string{
		"multiturn uses 2 (a history on every turn from 2 on: 2), misses no_entry=2, tokens reused 220",
		"prefiller history pulls 2 (12 blocks), decode engine pins 4",
		"3 of 3 budget lines passed",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
