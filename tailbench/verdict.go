package tailbench

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Line is one line of the closing table: a budget with its verdict, or a
// figure shown for context (a control run) that has no budget.
type Line struct {
	// Scenario numbers the scenario the line belongs to.
	Scenario int
	// Budget says what is promised ("hedged TTFT p99 ≤ 1.3× healthy P/D p99").
	Budget string
	// Measured gives the numbers behind the verdict.
	Measured string
	// Met is the verdict; Info lines have none.
	Met  bool
	Info bool
}

// verdict is the word the table prints for l.
func (l Line) verdict() string {
	switch {
	case l.Info:
		return "(control)"
	case l.Met:
		return "met"
	default:
		return "MISSED"
	}
}

// atMost is the budget "got ≤ factor × base" (factor 1: got ≤ base).
func atMost(scenario int, budget string, got, base, factor float64, unit string) Line {
	limit := base * factor
	return Line{Scenario: scenario, Budget: budget, Met: got <= limit && base > 0,
		Measured: fmt.Sprintf("%s vs %s (%.2f×)", num(got, unit), limitText(base, factor, unit), ratio(got, base))}
}

func limitText(base, factor float64, unit string) string {
	if factor == 1 {
		return num(base, unit)
	}
	return fmt.Sprintf("%.2g × %s = %s", factor, num(base, unit), num(base*factor, unit))
}

// num prints a figure with its unit.
func num(v float64, unit string) string {
	switch unit {
	case "ms":
		if v >= 100 {
			return fmt.Sprintf("%.0f ms", v)
		}
		return fmt.Sprintf("%.1f ms", v)
	case "":
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.0f %s", v, unit)
	}
}

// ratio is a / b, 0 when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// withinNoise reports whether a and b are the same within noise: their
// ratio within 1±rel, or their difference within abs (a few milliseconds
// of loopback jitter matter at 5 ms, not at 500).
func withinNoise(a, b, rel, abs float64) bool {
	if d := a - b; d <= abs && -d <= abs {
		return true
	}
	r := ratio(a, b)
	return r >= 1-rel && r <= 1+rel
}

// hedgeAllowance is how many hedges --prefill-hedge-budget allows over
// splits split requests: the bucket starts full (burst) and each split
// adds budget.
func hedgeAllowance(splits, budget float64, burst int) float64 {
	return splits*budget + float64(burst)
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// writeLines prints the closing table and reports how many budget lines
// were missed.
func writeLines(w io.Writer, lines []Line) (missed int, err error) {
	fmt.Fprintln(w, "\n== Budget ==")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tbudget\tmeasured\tverdict")
	for _, l := range lines {
		if !l.Info && !l.Met {
			missed++
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", l.Scenario, l.Budget, l.Measured, l.verdict())
	}
	if err := tw.Flush(); err != nil {
		return missed, err
	}
	budgets := 0
	for _, l := range lines {
		if !l.Info {
			budgets++
		}
	}
	fmt.Fprintf(w, "%d of %d budget lines met\n", budgets-missed, budgets)
	return missed, nil
}
