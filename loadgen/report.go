package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// Report is the machine-readable result of a run (pd-bench --json).
type Report struct {
	Workload string    `json:"workload"`
	Load     string    `json:"load"`
	Targets  []Summary `json:"targets"`
}

// WriteJSON writes r as indented JSON.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the side-by-side table, with every target's throughput
// as a ratio of the first target's and its TTFT as a difference from the
// first target's.
func (r Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "workload: %s\nload: %s\n\n", r.Workload, r.Load)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tok\terrors\tcut\treq/s\t× first\ttok/s\tTTFT p50\tp90\tp99\tmax\tΔTTFT p50\tΔp99\tITL p50\tp99\tE2E p50\tp99\t")
	var base Summary
	for i, s := range r.Targets {
		if i == 0 {
			base = s
		}
		ratio := 0.0
		if base.ReqPerSec > 0 {
			ratio = s.ReqPerSec / base.ReqPerSec
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.2f\t%.0f\t%s\t%s\t%s\t%s\t%+.3f\t%+.3f\t%s\t%s\t%s\t%s\t\n",
			s.Name, s.OK, s.Requests-s.OK-s.Left, s.CutShort, s.ReqPerSec, ratio, s.TokPerSec,
			ms(s.TTFT.P50), ms(s.TTFT.P90), ms(s.TTFT.P99), ms(s.TTFT.Max),
			s.TTFT.P50-base.TTFT.P50, s.TTFT.P99-base.TTFT.P99,
			ms(s.InterToken.P50), ms(s.InterToken.P99), ms(s.E2E.P50), ms(s.E2E.P99))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "(latencies in ms; Δ columns: ms added over the first target)")
	for _, s := range r.Targets {
		if s.Left > 0 {
			fmt.Fprintf(w, "%s: %d clients left on purpose (%d of them after the answer's head), neither ok nor errors\n", s.Name, s.Left, s.LeftAfterHead)
		}
	}
	for _, s := range r.Targets {
		if len(s.Errors) == 0 && s.Dropped == 0 {
			continue
		}
		kinds := make([]string, 0, len(s.Errors))
		for k, n := range s.Errors {
			kinds = append(kinds, fmt.Sprintf("%s: %d", k, n))
		}
		sort.Strings(kinds)
		if s.Dropped > 0 {
			kinds = append(kinds, fmt.Sprintf("dropped arrivals: %d", s.Dropped))
		}
		fmt.Fprintf(w, "%s errors: %s\n", s.Name, strings.Join(kinds, ", "))
	}
	return nil
}

func ms(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}
