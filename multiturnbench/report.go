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

// The criteria.
const (
	// computedBudget and computedShare: from turn 2 on, a with mode's
	// prefill computes at most computedBudget times the turn's new tokens
	// (the rest is block rounding of the history) in at least
	// computedShare of the turns, conversation by conversation.
	computedBudget = 1.1
	computedShare  = 0.95
	// ttftBudget: over the turns from the second on, pooled, a with mode's
	// TTFT median is at most this share of the without mode's. Pooled, not
	// turn by turn: on turn 2 the history is a single user message and
	// answer, so even a free history leaves a good part of the without
	// mode's prefill, and the ratio then falls turn by turn as the history
	// grows (the tables show every turn's).
	ttftBudget = 0.6
	// Turn 1 has no history, so every mode is the same within noise: the
	// TTFT medians within ±noiseRel or ±noiseAbs, the computed tokens
	// within ±computedNoise.
	noiseRel      = 0.2
	noiseAbs      = 20 * time.Millisecond
	computedNoise = 0.02
)

// Verdicts of a criterion line.
const (
	Pass = "PASS"
	Fail = "FAIL"
	NA   = "n/a"
)

// Line is one criterion line.
type Line struct {
	Mode, Criterion, Measured, Verdict string
}

func verdict(ok bool) string {
	if ok {
		return Pass
	}
	return Fail
}

// ratio is a / b, 0 when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// msText prints a duration in milliseconds.
func msText(d time.Duration) string {
	if v := ms(d); v < 100 {
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", ms(d))
}

// turnsAt are the records of turn k (1-based) over the conversations.
func (mr *modeResult) turnsAt(k int) []*turnRec {
	var out []*turnRec
	for _, recs := range mr.turns {
		if k <= len(recs) {
			out = append(out, recs[k-1])
		}
	}
	return out
}

// maxTurns is the longest conversation's turns.
func (mr *modeResult) maxTurns() int {
	n := 0
	for _, recs := range mr.turns {
		n = max(n, len(recs))
	}
	return n
}

// within reports whether a turn's computed tokens are within the budget of
// its new tokens.
func within(r *turnRec) bool {
	return float64(r.computed) <= computedBudget*float64(r.newTokens)
}

// laterTTFT is the TTFT median of every turn from the second on, pooled.
func (mr *modeResult) laterTTFT() time.Duration {
	var all []time.Duration
	for _, recs := range mr.turns {
		for _, r := range recs[min(1, len(recs)):] {
			all = append(all, r.ttft)
		}
	}
	return loadgen.Median(all)
}

func medianInt(v []int) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return float64(s[len(s)/2])
	}
	return float64(s[len(s)/2-1]+s[len(s)/2]) / 2
}

// computedLine judges a with mode's prefill work turn by turn.
func computedLine(mr *modeResult) Line {
	l := Line{Mode: mr.mode.name, Criterion: fmt.Sprintf("turns ≥ 2: prefill computes ≤ %.1f× the turn's new tokens in ≥ %.0f %% of turns", computedBudget, computedShare*100), Verdict: NA}
	if !mr.ledger {
		l.Measured = "engine-sim exports no GET /sim/computed: not measured"
		return l
	}
	ok, n, unmeasured := 0, 0, 0
	var worst *turnRec
	for _, recs := range mr.turns {
		for _, r := range recs[min(1, len(recs)):] {
			if !r.measured {
				unmeasured++
				continue
			}
			n++
			if within(r) {
				ok++
			}
			if worst == nil || ratio(float64(r.computed), float64(r.newTokens)) > ratio(float64(worst.computed), float64(worst.newTokens)) {
				worst = r
			}
		}
	}
	if n == 0 {
		l.Measured = "no turn from 2 on"
		return l
	}
	l.Measured = fmt.Sprintf("%d of %d turns (%.1f %%); worst %s: %d computed / %d new = %.2f×",
		ok, n, 100*float64(ok)/float64(n), worst.id, worst.computed, worst.newTokens, ratio(float64(worst.computed), float64(worst.newTokens)))
	if unmeasured > 0 {
		l.Measured += fmt.Sprintf("; %d turns not in any engine's ledger", unmeasured)
	}
	l.Verdict = verdict(float64(ok) >= computedShare*float64(n) && unmeasured == 0)
	return l
}

// ttftLine compares a with mode's pooled TTFT median to the baseline's.
func ttftLine(mr, without *modeResult) Line {
	l := Line{Mode: mr.mode.name, Criterion: fmt.Sprintf("turns ≥ 2: TTFT p50 ≤ %.1f× without (pooled)", ttftBudget), Verdict: NA, Measured: "needs the without mode"}
	if without == nil || mr.maxTurns() < 2 || without.maxTurns() < 2 {
		return l
	}
	worst, at := 0.0, 0
	for k := 2; k <= min(mr.maxTurns(), without.maxTurns()); k++ {
		if r := ratio(ms(turnTTFT(mr, k)), ms(turnTTFT(without, k))); r >= worst {
			worst, at = r, k
		}
	}
	a, b := mr.laterTTFT(), without.laterTTFT()
	pooled := ratio(ms(a), ms(b))
	l.Measured = fmt.Sprintf("%s vs %s = %.2f× (worst turn %d: %.2f×)", msText(a), msText(b), pooled, at, worst)
	l.Verdict = verdict(pooled <= ttftBudget && b > 0)
	return l
}

func turnTTFT(mr *modeResult, k int) time.Duration {
	var v []time.Duration
	for _, r := range mr.turnsAt(k) {
		v = append(v, r.ttft)
	}
	return loadgen.Median(v)
}

func turnComputed(mr *modeResult, k int) float64 {
	var v []int
	for _, r := range mr.turnsAt(k) {
		v = append(v, r.computed)
	}
	return medianInt(v)
}

// firstTurnLine checks that turn 1, which has no history, is the baseline's
// within noise.
func firstTurnLine(mr, without *modeResult) Line {
	l := Line{Mode: mr.mode.name, Criterion: fmt.Sprintf("turn 1: = without within noise (TTFT p50 ±%.0f %% or ±%v, computed ±%.0f %%)", noiseRel*100, noiseAbs, computedNoise*100),
		Verdict: NA, Measured: "needs the without mode"}
	if without == nil || mr.maxTurns() < 1 || without.maxTurns() < 1 {
		return l
	}
	a, b := turnTTFT(mr, 1), turnTTFT(without, 1)
	d := a - b
	r := ratio(ms(a), ms(b))
	ttftOK := (d <= noiseAbs && -d <= noiseAbs) || (r >= 1-noiseRel && r <= 1+noiseRel)
	ca, cb := turnComputed(mr, 1), turnComputed(without, 1)
	cr := ratio(ca, cb)
	compOK := !mr.ledger || !without.ledger || (cr >= 1-computedNoise && cr <= 1+computedNoise)
	l.Measured = fmt.Sprintf("TTFT p50 %s vs %s (%.2f×), computed p50 %.0f vs %.0f", msText(a), msText(b), r, ca, cb)
	l.Verdict = verdict(ttftOK && compOK)
	return l
}

// identicalAnswers counts the turns whose answer is the same in both
// modes: engine-sim's output is a function of the KV the decode reads, so
// a history pulled wrong changes the answer.
func identicalAnswers(a, b *modeResult) (same, total int) {
	for c := range min(len(a.turns), len(b.turns)) {
		for k := range min(len(a.turns[c]), len(b.turns[c])) {
			total++
			if a.turns[c][k].answer == b.turns[c][k].answer {
				same++
			}
		}
	}
	return same, total
}

// answersLine compares a mode's answers with the reference mode's.
func answersLine(mr, ref *modeResult) Line {
	l := Line{Mode: mr.mode.name, Verdict: NA, Criterion: "answers token-identical", Measured: "one mode alone"}
	if ref == nil {
		return l
	}
	l.Criterion = "answers token-identical to " + ref.mode.name
	same, total := identicalAnswers(mr, ref)
	l.Measured = fmt.Sprintf("%d of %d turns", same, total)
	l.Verdict = verdict(same == total && total > 0)
	return l
}

// criteria are every with mode's lines, the first mode run (the without
// mode where it ran) the reference.
func criteria(results []*modeResult) []Line {
	var without, ref *modeResult
	for _, mr := range results {
		if !mr.mode.with() && without == nil {
			without = mr
		}
	}
	ref = without
	if ref == nil && len(results) > 0 {
		ref = results[0]
	}
	var lines []Line
	for _, mr := range results {
		if !mr.mode.with() {
			continue
		}
		r := ref
		if r == mr {
			r = nil
		}
		lines = append(lines, computedLine(mr), ttftLine(mr, without), answersLine(mr, r), firstTurnLine(mr, without))
	}
	return lines
}

// report is what a run prints after its modes.
type report struct {
	o       Options
	results []*modeResult
}

func buildReport(o Options, results []*modeResult) report { return report{o: o, results: results} }

// write prints the per-turn tables, the pinned KV and the criteria.
func (r report) write(w io.Writer) error {
	var without *modeResult
	for _, mr := range r.results {
		if !mr.mode.with() {
			without = mr
			break
		}
	}
	for _, mr := range r.results {
		if err := r.writeMode(w, mr, without); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "(new: this turn's prompt tokens less the previous turn's prompt and output tokens, as the engine counted them (usage): the new user message and")
	fmt.Fprintln(w, " its template tokens, what lies beyond the history the decode engine pinned; computed: the prompt tokens the engines computed for the request,")
	fmt.Fprintln(w, " from engine-sim's ledger (GET /sim/computed), prefiller and any local prefill together; ≤1.1×: turns whose computed ≤ 1.1× new; history:")
	fmt.Fprintln(w, " tokens the prefiller pulled from the decode engine; uses/misses: the sidecar's pd_sidecar_multiturn_uses_total / _misses_total over the turn)")
	if err := r.writePins(w); err != nil {
		return err
	}

	fmt.Fprintln(w, "\n== Criteria (per with mode) ==")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\tcriterion\tmeasured\tverdict")
	lines := criteria(r.results)
	for _, l := range lines {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", l.Mode, l.Criterion, l.Measured, l.Verdict)
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
	fmt.Fprintf(w, "%d of %d criteria lines passed\n", passed, judged)
	return nil
}

// writeMode prints a mode's per-turn table and counters.
func (r report) writeMode(w io.Writer, mr, without *modeResult) error {
	going := 0
	for _, recs := range mr.turns {
		if len(recs) > 1 {
			going++
		}
	}
	fmt.Fprintf(w, "\n== %s: %s; medians over the conversations (%d of %d went on after turn 1) ==\n",
		mr.mode.name, mr.mode.describe(r.o.SessionHeader, r.o.PodName), going, len(mr.turns))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "turn\tconvs\tnew\tcomputed\tcomputed/new\t≤1.1×\thistory\tTTFT p50\tvs without\tuses\tmisses\t")
	for k := 1; k <= mr.maxTurns(); k++ {
		recs := mr.turnsAt(k)
		var newT, comp, hist []int
		okN := 0
		for _, t := range recs {
			newT, comp, hist = append(newT, t.newTokens), append(comp, t.computed), append(hist, t.history)
			if within(t) {
				okN++
			}
		}
		compText, perNew, share, histText := "-", "-", "-", "-"
		if mr.ledger {
			compText = fmt.Sprintf("%.0f", medianInt(comp))
			perNew = fmt.Sprintf("%.2f", ratio(medianInt(comp), medianInt(newT)))
			share = fmt.Sprintf("%d/%d", okN, len(recs))
			histText = fmt.Sprintf("%.0f", medianInt(hist))
		}
		vs := "-"
		if without != nil && without != mr && k <= without.maxTurns() {
			vs = fmt.Sprintf("%.2f×", ratio(ms(turnTTFT(mr, k)), ms(turnTTFT(without, k))))
		}
		uses, misses := "-", "-"
		if mr.mode.with() && k <= len(mr.perTurn) {
			uses, misses = fmt.Sprintf("%.0f", mr.perTurn[k-1].uses), fmt.Sprintf("%.0f", mr.perTurn[k-1].misses)
		}
		fmt.Fprintf(tw, "%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", k, len(recs), medianInt(newT), compText, perNew, share, histText,
			msText(turnTTFT(mr, k)), vs, uses, misses)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !mr.ledger {
		fmt.Fprintf(w, "NOTE: %s: engine-sim exports no GET /sim/computed: the prompt tokens computed per turn are not measured\n", mr.mode.name)
	}
	if mr.usageMismatches > 0 {
		fmt.Fprintf(w, "NOTE: %s: %d answers reported prompt_tokens other than the bench's count of engine-sim's tokens (the engine's count is used)\n", mr.mode.name, mr.usageMismatches)
	}
	if !mr.mode.with() {
		return nil
	}
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
	later := 0
	for _, recs := range mr.turns {
		later += max(0, len(recs)-1)
	}
	fmt.Fprintf(w, "  sidecar: multiturn uses %.0f (turns from 2 on: %d), misses %s, tokens reused %.0f\n", mr.uses, later, missText, mr.reused)
	fmt.Fprintf(w, "  engines: prefiller history pulls %.0f (%.0f blocks), decode engine pins %.0f\n", mr.pulls, mr.blocksPulled, mr.pins)
	return nil
}

// writePins prints what the decode engine's pins held in every with mode:
// sampled, then pin by pin from the ledgers.
func (r report) writePins(w io.Writer) error {
	bs := float64(r.o.BlockSize)
	fmt.Fprintf(w, "\n== Pinned KV on the decode engine: sim_kv_blocks_held sampled every %v from the first turn until no block is held or the tail's bound ==\n", r.o.SampleEvery)
	sampled := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(sampled, "mode\tTTL\twindow\tblock·s\ttoken·s\tpeak blocks\theld at end\t+ until TTL\t= block·s to TTL\tsidecar's estimate\t")
	var byPin strings.Builder
	pins := tabwriter.NewWriter(&byPin, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(pins, "mode\tpins\tread\tnever read\tabandoned\tlast turn\tlost\t")
	var notes []string
	for _, mr := range r.results {
		if !mr.mode.with() {
			continue
		}
		var c pinCost
		c.integrate(mr.pinned.samples)
		c.attribute(mr.turns, mr.abandoned, mr.mode.ttl, mr.pinned.end)
		est := "not exposed"
		if c.estSeen {
			est = fmt.Sprintf("%.0f token·s, peak %.0f tokens", c.estTokenSeconds, c.estPeak)
		}
		fmt.Fprintf(sampled, "%s\t%v\t%.1f s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t\n",
			mr.mode.name, mr.mode.ttl, mr.pinned.end.Seconds(), c.blockSeconds, c.blockSeconds*bs, c.peak, c.heldAtEnd, c.afterEnd,
			c.blockSeconds+c.afterEnd, est)
		class := func(p pinShare) string {
			return fmt.Sprintf("%d: %.0f (%.0f %%)", p.n, p.blockSeconds, 100*ratio(p.blockSeconds, c.attributed()))
		}
		fmt.Fprintf(pins, "%s\t%d\t%s\t%.0f (%.0f %%)\t%s\t%s\t%s\t\n", mr.mode.name, c.pins, class(c.read),
			c.neverRead(), 100*ratio(c.neverRead(), c.attributed()), class(c.abandoned), class(c.last), class(c.lost))
		if a := c.attributed(); c.blockSeconds > 0 && (a < 0.9*c.blockSeconds || a > 1.1*c.blockSeconds) {
			notes = append(notes, fmt.Sprintf("NOTE: %s: the pins attributed from the ledgers sum to %.0f block·s, the samples to %.0f: the attribution is off by more than 10 %%", mr.mode.name, a, c.blockSeconds))
		}
	}
	if err := sampled.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "(block·s, peak, held at end: sampled in the window; token·s = block·s × the block size; + until TTL: block·s the pins held at the end keep")
	fmt.Fprintln(w, " past the window until their TTL, from the ledgers, not sampled; sidecar's estimate: pd_sidecar_multiturn_pinned_tokens at the same instants)")
	if err := pins.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nPin by pin, from the ledgers, in the window (\"pins: block·s (share)\"; a pin lives from its answer's end to the next turn's send when that")
	fmt.Fprintln(w, "turn pulled it, else to its TTL; abandoned: first turns of conversations that stopped; last turn: the last turns; lost: pins whose next turn")
	fmt.Fprintln(w, "pulled no history):")
	fmt.Fprint(w, byPin.String())
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	return nil
}
