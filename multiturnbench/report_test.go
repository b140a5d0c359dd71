package multiturnbench

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"
)

// synth builds a mode's result: every conversation has the turns given,
// each turn k's record from at(k).
func synth(m mode, convs int, turns []func(c int) *turnRec) *modeResult {
	mr := &modeResult{mode: m, ledger: true, turns: make([][]*turnRec, convs), abandoned: make([]bool, convs)}
	for c := range convs {
		for _, f := range turns {
			mr.turns[c] = append(mr.turns[c], f(c))
		}
	}
	return mr
}

func tr(newTok, computed, ttftMS int, answer string) func(int) *turnRec {
	return func(c int) *turnRec {
		return &turnRec{id: "t", measured: true, newTokens: newTok, computed: computed, ttft: time.Duration(ttftMS) * time.Millisecond, answer: answer}
	}
}

func TestCriteria(t *testing.T) {
	without := synth(mode{name: ModeWithout}, 20, []func(int) *turnRec{tr(1000, 1000, 100, "a"), tr(500, 2000, 300, "b"), tr(500, 3000, 400, "c")})
	with := func(name string, turns ...func(int) *turnRec) *modeResult {
		return synth(mode{name: name, token: TokenConversation, ttl: time.Minute}, 20, turns)
	}
	// 19 of 20 conversations within 1.1× on turn 3, one over: 39 of 40.
	mostly := func(c int) *turnRec {
		if c == 0 {
			return tr(500, 600, 110, "c")(c)
		}
		return tr(500, 540, 110, "c")(c)
	}
	tooMany := func(c int) *turnRec {
		if c < 3 {
			return tr(500, 3000, 110, "c")(c)
		}
		return tr(500, 500, 110, "c")(c)
	}
	for _, tc := range []struct {
		name     string
		results  []*modeResult
		want     []string // verdicts: computed, TTFT, answers, turn 1
		measured []string
	}{{
		name:     "every criterion met",
		results:  []*modeResult{without, with("with-conversation", tr(1000, 1000, 105, "a"), tr(500, 520, 120, "b"), mostly)},
		want:     []string{Pass, Pass, Pass, Pass},
		measured: []string{"39 of 40 turns (97.5 %)", "115 ms vs 350 ms = 0.33×", "60 of 60 turns", "computed p50 1000 vs 1000"},
	}, {
		name:     "history lost: computed, TTFT over, answers the same",
		results:  []*modeResult{without, with("with-pod", tr(1000, 1000, 100, "a"), tr(500, 2000, 290, "b"), tr(500, 3000, 390, "c"))},
		want:     []string{Fail, Fail, Pass, Pass},
		measured: []string{"0 of 40 turns (0.0 %)", "= 0.97×"},
	}, {
		name:     "under 95 %: 37 of 40",
		results:  []*modeResult{without, with("with-conversation", tr(1000, 1000, 100, "a"), tr(500, 500, 100, "b"), tooMany)},
		want:     []string{Fail, Pass, Pass, Pass},
		measured: []string{"37 of 40 turns (92.5 %)"},
	}, {
		name:    "a wrong answer",
		results: []*modeResult{without, with("with-conversation", tr(1000, 1000, 100, "a"), tr(500, 500, 100, "B"), tr(500, 500, 100, "c"))},
		want:    []string{Pass, Pass, Fail, Pass},
	}, {
		name: "no ledger: not judged",
		results: []*modeResult{without, func() *modeResult {
			m := with("with-conversation", tr(1000, 0, 100, "a"), tr(500, 0, 100, "b"))
			m.ledger = false
			return m
		}()},
		want:     []string{NA, Pass, Pass, Pass},
		measured: []string{"not measured"},
	}, {
		name:     "with mode alone",
		results:  []*modeResult{with("with-conversation", tr(1000, 1000, 100, "a"), tr(500, 500, 100, "b"))},
		want:     []string{Pass, NA, NA, NA},
		measured: []string{"20 of 20 turns", "needs the without mode", "one mode alone", "needs the without mode"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			lines := criteria(tc.results)
			if len(lines) != len(tc.want) {
				t.Fatalf("%d lines, want %d", len(lines), len(tc.want))
			}
			for i, l := range lines {
				if l.Verdict != tc.want[i] {
					t.Errorf("line %d (%s): %s (%s), want %s", i+1, l.Criterion, l.Verdict, l.Measured, tc.want[i])
				}
				if i < len(tc.measured) && tc.measured[i] != "" && !strings.Contains(l.Measured, tc.measured[i]) {
					t.Errorf("line %d measured %q, want it to hold %q", i+1, l.Measured, tc.measured[i])
				}
			}
		})
	}
}

func TestIdenticalAnswers(t *testing.T) {
	rec := func(a string) *turnRec { return &turnRec{answer: a} }
	a := &modeResult{turns: [][]*turnRec{{rec(" a"), rec(" b")}, {rec(" c")}}}
	b := &modeResult{turns: [][]*turnRec{{rec(" a"), rec(" x")}, {rec(" c"), rec(" d")}}}
	if same, total := identicalAnswers(a, b); same != 2 || total != 3 {
		t.Errorf("got %d of %d, want 2 of 3 (the turns both modes ran)", same, total)
	}
}

// The report prints a table per mode, the pinned KV and the criteria with
// their count.
func TestReportWrite(t *testing.T) {
	o := DefaultOptions()
	o.Conversations, o.Turns = 2, 2
	without := synth(mode{name: ModeWithout}, 2, []func(int) *turnRec{tr(100, 100, 10, "a"), tr(100, 200, 40, "b")})
	with := synth(mode{name: "with-conversation", token: TokenConversation, ttl: 10 * time.Second}, 2,
		[]func(int) *turnRec{tr(100, 100, 10, "a"), tr(100, 105, 12, "b")})
	with.perTurn = []turnCounters{{misses: 2}, {uses: 2}}
	with.uses, with.reused, with.misses, with.pulls, with.blocksPulled, with.pins, with.sidecarMetricsSeen = 2, 220, map[string]float64{"no_entry": 2}, 2, 12, 4, true
	for c := range with.turns {
		with.turns[c][0].pinnedBlocks, with.turns[c][0].ended = 10, time.Second
		with.turns[c][1].history, with.turns[c][1].sent = 96, 2*time.Second
		with.turns[c][1].pinnedBlocks, with.turns[c][1].ended = 12, 3*time.Second
	}
	with.pinned = pinnedSeries{end: 5 * time.Second, samples: []sample{
		{at: 0, ok: true}, {at: time.Second, held: 20, ok: true}, {at: 2 * time.Second, held: 20, ok: true},
		{at: 3 * time.Second, held: 24, ok: true}, {at: 5 * time.Second, held: 24, ok: true}}}
	var out bytes.Buffer
	if err := buildReport(o, []*modeResult{without, with}).write(&out); err != nil {
		t.Fatal(err)
	}
	// Rows: turn, convs, new, computed, computed/new, ≤1.1×, history, TTFT
	// p50, vs without, uses, misses.
	for _, row := range []string{
		`(?m)^\s*2\s+2\s+100\s+200\s+2\.00\s+0/2\s+0\s+40\.0 ms\s+-\s+-\s+-\s*$`,
		`(?m)^\s*2\s+2\s+100\s+105\s+1\.05\s+2/2\s+96\s+12\.0 ms\s+0\.30×\s+2\s+0\s*$`,
		// 10+20+22+48 block·s sampled; 24 held at the end, 12 each until 13 s.
		`(?m)^\s*with-conversation\s+10s\s+5\.0 s\s+100\s+1600\s+24\s+24\s+192\s+292\s+not exposed\s*$`,
		// Two read pins of 10 blocks for 1 s; two last-turn pins of 12
		// blocks for 2 s.
		`(?m)^\s*with-conversation\s+4\s+2: 20 \(29 %\)\s+48 \(71 %\)\s+0: 0 \(0 %\)\s+2: 48 \(71 %\)\s+0: 0 \(0 %\)\s*$`,
	} {
		if !regexp.MustCompile(row).MatchString(out.String()) {
			t.Errorf("report lacks a row matching %s:\n%s", row, out.String())
		}
	}
	for _, want := range []string{
		"multiturn uses 2 (turns from 2 on: 2), misses no_entry=2, tokens reused 220",
		"prefiller history pulls 2 (12 blocks), decode engine pins 4",
		"4 of 4 criteria lines passed",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
