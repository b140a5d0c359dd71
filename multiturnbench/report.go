package multiturnbench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// turnSummary is one turn of one mode: means over the conversations and
// the TTFT median.
type turnSummary struct {
	Turn int
	// NewTokens is the mean of the turn's new prompt tokens.
	NewTokens float64
	// Computed is the prefiller's computed prompt tokens a conversation,
	// DecoderComputed the decode engine's (its own prefills: fallbacks).
	Computed, DecoderComputed float64
	// TTFT is the median time to the first token.
	TTFT time.Duration
	// Uses and Misses are the sidecar's multiturn counters' growth over
	// the turn, all conversations together.
	Uses, Misses float64
}

// modeSummary is one mode's turns and the TTFT median of every turn from
// the second on, pooled.
type modeSummary struct {
	Turns     []turnSummary
	LaterTTFT time.Duration
}

// summarize reduces a mode's turns.
func summarize(mr *modeResult) *modeSummary {
	out := &modeSummary{Turns: make([]turnSummary, 0, len(mr.turns))}
	var later []time.Duration
	for k, td := range mr.turns {
		if k > 0 {
			later = append(later, td.ttft...)
		}
		n := float64(len(td.newTokens))
		sum := 0
		for _, t := range td.newTokens {
			sum += t
		}
		out.Turns = append(out.Turns, turnSummary{
			Turn: k + 1, NewTokens: float64(sum) / n,
			Computed: td.computed / n, DecoderComputed: td.decoderComputed / n,
			TTFT: loadgen.Median(td.ttft), Uses: td.uses, Misses: td.misses,
		})
	}
	out.LaterTTFT = loadgen.Median(later)
	return out
}

// ratio is a / b, 0 when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// The budgets.
const (
	// computedBudget: from turn 2 on, the with mode's prefiller computes at
	// most this many times the turn's new tokens (the rest is block
	// rounding of the history).
	computedBudget = 1.1
	// ttftBudget: over the turns from the second on, pooled, the with
	// mode's TTFT median is at most this share of the without mode's.
	// Pooled, not turn by turn: on turn 2 the history is a single user
	// message, so even a free history leaves the with mode about half the
	// without mode's prefill, and the ratio then falls turn by turn as the
	// history grows (the table shows every turn's).
	ttftBudget = 0.6
	// Turn 1 has no history, so both modes are the same within noise: the
	// TTFT medians within ±noiseRel or ±noiseAbs, the computed tokens
	// within ±computedNoise.
	noiseRel      = 0.2
	noiseAbs      = 20 * time.Millisecond
	computedNoise = 0.02
)

// Verdicts of a budget line.
const (
	Pass = "PASS"
	Fail = "FAIL"
	NA   = "n/a"
)

// Line is one budget line.
type Line struct {
	Budget, Measured, Verdict string
}

func verdict(ok bool) string {
	if ok {
		return Pass
	}
	return Fail
}

// budgetLines checks the budgets; a mode that did not run (nil) makes the
// lines that need it n/a.
func budgetLines(withoutMode, withMode *modeSummary) []Line {
	var without, with []turnSummary
	if withoutMode != nil {
		without = withoutMode.Turns
	}
	if withMode != nil {
		with = withMode.Turns
	}
	turns := max(len(without), len(with))
	later := fmt.Sprintf("turns 2-%d", turns)
	comp := Line{Budget: fmt.Sprintf("%s: computed on the prefillers ≤ %.1f× the turn's new tokens (with, every turn)", later, computedBudget), Verdict: NA, Measured: "with mode not run"}
	if len(with) > 1 {
		worst, at := 0.0, 0
		for _, t := range with[1:] {
			if r := ratio(t.Computed, t.NewTokens); r >= worst {
				worst, at = r, t.Turn
			}
		}
		t := with[at-1]
		comp.Measured = fmt.Sprintf("worst turn %d: %.0f computed / %.0f new = %.2f×", at, t.Computed, t.NewTokens, worst)
		comp.Verdict = verdict(worst <= computedBudget)
	}
	ttft := Line{Budget: fmt.Sprintf("%s: TTFT p50 with ≤ %.1f× without (the turns pooled)", later, ttftBudget), Verdict: NA, Measured: "needs both modes"}
	first := Line{Budget: fmt.Sprintf("turn 1: with = without within noise (TTFT p50 ±%.0f %% or ±%v, computed ±%.0f %%)", noiseRel*100, noiseAbs, computedNoise*100),
		Verdict: NA, Measured: "needs both modes"}
	if len(without) > 1 && len(with) == len(without) {
		worst, at := 0.0, 0
		for k := 1; k < len(with); k++ {
			if r := ratio(ms(with[k].TTFT), ms(without[k].TTFT)); r >= worst {
				worst, at = r, k+1
			}
		}
		pooled := ratio(ms(withMode.LaterTTFT), ms(withoutMode.LaterTTFT))
		ttft.Measured = fmt.Sprintf("%s vs %s = %.2f× (worst turn %d: %.2f×)", msText(withMode.LaterTTFT), msText(withoutMode.LaterTTFT), pooled, at, worst)
		ttft.Verdict = verdict(pooled <= ttftBudget && withoutMode.LaterTTFT > 0)

		a, b := with[0], without[0]
		d := a.TTFT - b.TTFT
		ttftOK := (d <= noiseAbs && -d <= noiseAbs) || (ratio(ms(a.TTFT), ms(b.TTFT)) >= 1-noiseRel && ratio(ms(a.TTFT), ms(b.TTFT)) <= 1+noiseRel)
		cr := ratio(a.Computed, b.Computed)
		compOK := cr >= 1-computedNoise && cr <= 1+computedNoise
		first.Measured = fmt.Sprintf("TTFT p50 %s vs %s (%.2f×), computed %.0f vs %.0f", msText(a.TTFT), msText(b.TTFT), ratio(ms(a.TTFT), ms(b.TTFT)), a.Computed, b.Computed)
		first.Verdict = verdict(ttftOK && compOK)
	}
	return []Line{comp, ttft, first}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// msText prints a duration in milliseconds.
func msText(d time.Duration) string {
	if v := ms(d); v < 100 {
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", ms(d))
}

// report is what a run prints after its modes.
type report struct {
	o             Options
	without, with *modeSummary
	modes         map[string]*modeResult
}

func buildReport(o Options, results []*modeResult) report {
	r := report{o: o, modes: map[string]*modeResult{}}
	for _, mr := range results {
		r.modes[mr.mode] = mr
		switch mr.mode {
		case ModeWithout:
			r.without = summarize(mr)
		case ModeWith:
			r.with = summarize(mr)
		}
	}
	return r
}

// identicalAnswers counts the turns whose answer is the same in both
// modes: engine-sim's output is a function of the KV the decode reads, so
// a history pulled wrong changes the answer.
func identicalAnswers(a, b *modeResult) (same, total int) {
	for c := range min(len(a.answers), len(b.answers)) {
		for k := range min(len(a.answers[c]), len(b.answers[c])) {
			total++
			if a.answers[c][k] == b.answers[c][k] {
				same++
			}
		}
	}
	return same, total
}

// write prints the per-turn table, the counters and the budget lines.
func (r report) write(w io.Writer) error {
	fmt.Fprintf(w, "\n== Per turn (means over %d conversations; computed: the prompt tokens the prefillers computed a conversation) ==\n", r.o.Conversations)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "turn\tnew tokens\tcomputed without\tcomputed with\twith/new\tTTFT p50 without\tTTFT p50 with\twith/without\tuses\tmisses\t")
	var without, with []turnSummary
	if r.without != nil {
		without = r.without.Turns
	}
	if r.with != nil {
		with = r.with.Turns
	}
	for k := range max(len(without), len(with)) {
		var wo, wi *turnSummary
		if k < len(without) {
			wo = &without[k]
		}
		if k < len(with) {
			wi = &with[k]
		}
		newTok := "-"
		switch {
		case wi != nil:
			newTok = fmt.Sprintf("%.0f", wi.NewTokens)
		case wo != nil:
			newTok = fmt.Sprintf("%.0f", wo.NewTokens)
		}
		col := func(t *turnSummary, f func(*turnSummary) string) string {
			if t == nil {
				return "-"
			}
			return f(t)
		}
		computed := func(t *turnSummary) string { return fmt.Sprintf("%.0f", t.Computed) }
		ttft := func(t *turnSummary) string { return msText(t.TTFT) }
		perNew, vs := "-", "-"
		if wi != nil {
			perNew = fmt.Sprintf("%.2f", ratio(wi.Computed, wi.NewTokens))
			if wo != nil {
				vs = fmt.Sprintf("%.2f×", ratio(ms(wi.TTFT), ms(wo.TTFT)))
			}
		}
		uses := col(wi, func(t *turnSummary) string { return fmt.Sprintf("%.0f", t.Uses) })
		misses := col(wi, func(t *turnSummary) string { return fmt.Sprintf("%.0f", t.Misses) })
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", k+1, newTok, col(wo, computed), col(wi, computed), perNew,
			col(wo, ttft), col(wi, ttft), vs, uses, misses)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "(new tokens: what the turn's prompt adds to the previous turn's, i.e. the answer carried back, the new user message and their template tokens;")
	fmt.Fprintln(w, " uses/misses: the with mode's sidecar pd_sidecar_multiturn_uses_total / _misses_total over the turn, all conversations)")

	for _, name := range []string{ModeWithout, ModeWith} {
		mr, ok := r.modes[name]
		if !ok {
			continue
		}
		var fallback float64
		for _, td := range mr.turns {
			fallback += td.decoderComputed
		}
		if fallback > 0 {
			fmt.Fprintf(w, "NOTE: %s: the decode engine computed %.0f prompt tokens itself (local prefills: the sidecar fell back)\n", name, fallback)
		}
		if mr.computedFromCache {
			fmt.Fprintf(w, "NOTE: %s: engine-sim exports no sim_prefill_computed_tokens_total: computed = its prefix cache's queries less hits\n", name)
		}
		if mr.usageMismatches > 0 {
			fmt.Fprintf(w, "NOTE: %s: %d answers reported prompt_tokens other than the bench's count of engine-sim's tokens (the engine's count is used)\n", name, mr.usageMismatches)
		}
	}
	if mr, ok := r.modes[ModeWith]; ok {
		fmt.Fprintf(w, "\nwith mode, over the conversations (warm-up excluded):\n")
		if !mr.sidecarMetricsSeen {
			fmt.Fprintln(w, "  sidecar: exports no pd_sidecar_multiturn_uses_total")
		}
		var reasons []string
		for _, k := range slices.Sorted(maps.Keys(mr.misses)) {
			reasons = append(reasons, fmt.Sprintf("%s=%.0f", k, mr.misses[k]))
		}
		missText := "none"
		if len(reasons) > 0 {
			missText = strings.Join(reasons, " ")
		}
		fmt.Fprintf(w, "  sidecar: multiturn uses %.0f (a history on every turn from 2 on: %d), misses %s, tokens reused %.0f\n",
			mr.uses, r.o.Conversations*(r.o.Turns-1), missText, mr.reused)
		fmt.Fprintf(w, "  engines: prefiller history pulls %.0f (%.0f blocks), decode engine pins %.0f\n", mr.pulls, mr.blocksPulled, mr.pins)
	}
	if a, okA := r.modes[ModeWithout]; okA {
		if b, okB := r.modes[ModeWith]; okB {
			same, total := identicalAnswers(a, b)
			fmt.Fprintf(w, "answers identical in both modes: %d of %d turns (engine-sim's output follows the KV the decode read)\n", same, total)
		}
	}

	fmt.Fprintln(w, "\n== Budget ==")
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "budget\tmeasured\tverdict")
	lines := budgetLines(r.without, r.with)
	for _, l := range lines {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", l.Budget, l.Measured, l.Verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	passed, judged := 0, 0
	for _, l := range lines {
		if l.Verdict != NA {
			judged++
			if l.Verdict == Pass {
				passed++
			}
		}
	}
	fmt.Fprintf(w, "%d of %d budget lines passed\n", passed, judged)
	return nil
}
