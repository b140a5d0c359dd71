package benchsuite

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// report is everything the suite measured (written with --json).
type report struct {
	Saturation loadgen.Report `json:"saturation"`
	OpenLoop   loadgen.Report `json:"open_loop,omitempty"`
	// Ramp is the ramp run: slow streams opened while thousands are open.
	Ramp  *rampReport `json:"ramp,omitempty"`
	Costs []proxyCost `json:"proxy_costs"`
	// Long is the long-prompt scenario, one run per prompt length.
	Long []longRun `json:"long_prompts,omitempty"`
}

// proxyCost is one proxy's resource use.
type proxyCost struct {
	Proxy         string  `json:"proxy"`
	Requests      int     `json:"requests"`
	CPUMicros     float64 `json:"cpu_us_per_request"`
	PeakRSSMiB    float64 `json:"peak_rss_mib"`
	StreamsOpen   int     `json:"streams_open,omitempty"`
	RSSIdleMiB    float64 `json:"rss_idle_mib,omitempty"`
	RSSStreamsMiB float64 `json:"rss_with_streams_mib,omitempty"`
	KBPerStream   float64 `json:"kb_per_stream,omitempty"`
	// CPUPerEvent is the CPU per SSE event relayed with the streams open.
	CPUPerEvent float64 `json:"cpu_us_per_streamed_event,omitempty"`
}

func summarize(load string, res []*loadgen.TargetResults) loadgen.Report {
	r := loadgen.Report{Workload: "chat, 128-word prompts, 16 output tokens, SSE", Load: load}
	for _, t := range res {
		r.Targets = append(r.Targets, loadgen.Summarize(t))
	}
	return r
}

func writeTable(w io.Writer, r loadgen.Report) error {
	fmt.Fprintln(os.Stderr)
	return r.WriteTable(w)
}

// costs divides each proxy's CPU time over the run by the requests its
// target sent.
func costs(proxies []proxyUnderTest, before, after map[string]procUsage, res []*loadgen.TargetResults) []proxyCost {
	served := map[string]int{}
	for _, t := range res {
		served[t.Target.Name] = len(t.Results)
	}
	var out []proxyCost
	for _, px := range proxies {
		b, a := before[px.name], after[px.name]
		c := proxyCost{Proxy: px.name, Requests: served[px.name], PeakRSSMiB: mib(a.PeakRSS)}
		if c.Requests > 0 {
			c.CPUMicros = float64(a.CPU-b.CPU) / float64(time.Microsecond) / float64(c.Requests)
		}
		out = append(out, c)
	}
	return out
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func writeCosts(w io.Writer, cs []proxyCost) {
	fmt.Fprintln(w, "\nproxy cost (CPU: utime+stime of the process tree from /proc, children included: per request over the saturation run;")
	fmt.Fprintln(w, "per streamed event over 3 s with the open streams running, the engine at 50 ms per token; sidecar-goroutines: --stream-loops=0)")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "proxy\trequests\tCPU µs/request\tpeak RSS MiB\topen streams\tRSS idle MiB\tRSS with streams MiB\tKB/stream\tCPU µs/streamed event\t")
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t\n", c.Proxy, c.Requests, c.CPUMicros, c.PeakRSSMiB,
			c.StreamsOpen, c.RSSIdleMiB, c.RSSStreamsMiB, c.KBPerStream, c.CPUPerEvent)
	}
	_ = tw.Flush()
}

func find(r loadgen.Report, name string) (loadgen.Summary, bool) {
	for _, s := range r.Targets {
		if s.Name == name {
			return s, true
		}
	}
	return loadgen.Summary{}, false
}

func findCost(cs []proxyCost, name string) (proxyCost, bool) {
	for _, c := range cs {
		if c.Proxy == name {
			return c, true
		}
	}
	return proxyCost{}, false
}

// writeBudget states each budget line of the performance issue with the
// figures of this run, met or not.
func writeBudget(w io.Writer, r *report) {
	fmt.Fprintln(w, "\nbudget (figures of this run)")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	direct, _ := find(r.Saturation, "direct")
	sc, okSC := find(r.Saturation, "sidecar")
	ng, okNG := find(r.Saturation, "nginx")
	if okSC && okNG && ng.ReqPerSec > 0 {
		fmt.Fprintf(w, "  passthrough saturation ≥ 1.0× nginx: %.2f× (%.0f vs %.0f req/s) — %s; %.2f× direct\n",
			sc.ReqPerSec/ng.ReqPerSec, sc.ReqPerSec, ng.ReqPerSec, verdict(sc.ReqPerSec >= ng.ReqPerSec), sc.ReqPerSec/direct.ReqPerSec)
	}
	cSC, ok1 := findCost(r.Costs, "sidecar")
	cNG, ok2 := findCost(r.Costs, "nginx")
	if ok1 && ok2 {
		fmt.Fprintf(w, "  passthrough CPU per request ≤ nginx: %.1f vs %.1f µs — %s\n", cSC.CPUMicros, cNG.CPUMicros, verdict(cSC.CPUMicros <= cNG.CPUMicros))
	}
	if gp, ok := find(r.Saturation, "go-proxy"); ok && okSC && gp.ReqPerSec > 0 {
		line := fmt.Sprintf("  (reference, no budget) Go's httputil.ReverseProxy: sidecar %.2f× its saturation", sc.ReqPerSec/gp.ReqPerSec)
		if cGP, ok := findCost(r.Costs, "go-proxy"); ok && ok1 && cSC.CPUMicros > 0 {
			line += fmt.Sprintf(", %.2f× less CPU per request (%.1f vs %.1f µs)", cGP.CPUMicros/cSC.CPUMicros, cSC.CPUMicros, cGP.CPUMicros)
		}
		fmt.Fprintln(w, line)
	}
	if peer, ok := find(r.Saturation, "peer"); ok && peer.ReqPerSec > 0 {
		fmt.Fprintf(w, "  passthrough saturation ≥ 3× peer sidecar: %.2f× — %s\n", sc.ReqPerSec/peer.ReqPerSec, verdict(sc.ReqPerSec >= 3*peer.ReqPerSec))
	}
	if len(r.OpenLoop.Targets) > 0 {
		d, _ := find(r.OpenLoop, "direct")
		s, _ := find(r.OpenLoop, "sidecar")
		if n, ok := find(r.OpenLoop, "nginx"); ok {
			fmt.Fprintf(w, "  passthrough added TTFT ≤ nginx's (p50/p99): sidecar %+.3f/%+.3f ms, nginx %+.3f/%+.3f ms — %s\n",
				s.TTFT.P50-d.TTFT.P50, s.TTFT.P99-d.TTFT.P99, n.TTFT.P50-d.TTFT.P50, n.TTFT.P99-d.TTFT.P99,
				verdict(s.TTFT.P50-d.TTFT.P50 <= n.TTFT.P50-d.TTFT.P50))
		}
		f, okF := find(r.OpenLoop, "floor")
		p, okP := find(r.OpenLoop, "sidecar-pd")
		if okF && okP {
			fmt.Fprintf(w, "  disaggregated added TTFT beyond the floor ≤ 0.1 ms p50: %+.3f ms (p99 %+.3f) — %s\n",
				p.TTFT.P50-f.TTFT.P50, p.TTFT.P99-f.TTFT.P99, verdict(p.TTFT.P50-f.TTFT.P50 <= 0.1))
		}
		if b, ok := hopBudgetLine(r.OpenLoop); ok {
			fmt.Fprintf(w, "  %s — %s\n", b.line, verdict(b.met))
		}
	}
	f, okF := find(r.Saturation, "floor")
	p, okP := find(r.Saturation, "sidecar-pd")
	if okF && okP && f.ReqPerSec > 0 {
		fmt.Fprintf(w, "  disaggregated saturation ≥ 0.7× the floor: %.2f× — %s\n", p.ReqPerSec/f.ReqPerSec, verdict(p.ReqPerSec >= 0.7*f.ReqPerSec))
	}
	for _, b := range previousBudgetLines(r) {
		fmt.Fprintf(w, "  %s — %s\n", b.line, verdict(b.met))
	}
	for _, pair := range [][2]string{{"sidecar", "sidecar-traced"}, {"sidecar-pd", "sidecar-pd-traced"}} {
		c, ok1 := findCost(r.Costs, pair[0])
		ct, ok2 := findCost(r.Costs, pair[1])
		if ok1 && ok2 && c.CPUMicros > 0 {
			fmt.Fprintf(w, "  %s with tracing on: CPU per request ≤ 1.15× without: %.2f× (%.1f vs %.1f µs) — %s\n",
				pair[0], ct.CPUMicros/c.CPUMicros, ct.CPUMicros, c.CPUMicros, verdict(ct.CPUMicros <= 1.15*c.CPUMicros))
		}
	}
	if c, ok := findCost(r.Costs, "sidecar"); ok && c.StreamsOpen > 0 {
		fmt.Fprintf(w, "  memory ≤ 18 KB per open stream: %.1f KB (%d streams, RSS %.1f MiB) — %s\n",
			c.KBPerStream, c.StreamsOpen, c.RSSStreamsMiB, verdict(c.KBPerStream <= 18))
	}
	for _, b := range rampBudgetLines(r.Ramp) {
		fmt.Fprintf(w, "  %s — %s\n", b.line, verdict(b.met))
	}
	for _, b := range longBudgetLines(r.Long) {
		fmt.Fprintf(w, "  %s — %s\n", b.line, verdict(b.met))
	}
	all := append(append([]loadgen.Summary{}, r.Saturation.Targets...), r.OpenLoop.Targets...)
	for _, l := range r.Long {
		all = append(all, l.Report.Targets...)
	}
	cut := 0
	for _, s := range all {
		if s.Name == "sidecar" || s.Name == "sidecar-pd" {
			cut += s.CutShort
		}
	}
	if r.Ramp != nil {
		for _, t := range r.Ramp.Targets {
			if t.Name == "sidecar" {
				cut += t.CutShort
			}
		}
	}
	fmt.Fprintf(w, "  zero sidecar streams cut short: %d — %s\n", cut, verdict(cut == 0))
}

// budgetLine is one budget line: its figures and whether it is met.
type budgetLine struct {
	line string
	met  bool
}

// previousBudgetLines holds the sidecar against the previous build, path by
// path: saturation at least the previous build's, CPU per request at most
// its (lines only where both ran).
func previousBudgetLines(r *report) []budgetLine {
	var out []budgetLine
	for _, path := range []struct{ label, sidecar, previous string }{
		{"local", "sidecar", "previous"}, {"P/D", "sidecar-pd", "previous-pd"}} {
		s, ok1 := find(r.Saturation, path.sidecar)
		p, ok2 := find(r.Saturation, path.previous)
		if ok1 && ok2 && p.ReqPerSec > 0 {
			out = append(out, budgetLine{fmt.Sprintf("%s saturation ≥ 1.0× the previous build: %.2f× (%.0f vs %.0f req/s)",
				path.label, s.ReqPerSec/p.ReqPerSec, s.ReqPerSec, p.ReqPerSec), s.ReqPerSec >= p.ReqPerSec})
		}
		cs, ok1 := findCost(r.Costs, path.sidecar)
		cp, ok2 := findCost(r.Costs, path.previous)
		if ok1 && ok2 && cp.CPUMicros > 0 {
			out = append(out, budgetLine{fmt.Sprintf("%s CPU per request ≤ 1.0× the previous build: %.2f× (%.1f vs %.1f µs)",
				path.label, cs.CPUMicros/cp.CPUMicros, cs.CPUMicros, cp.CPUMicros), cs.CPUMicros <= cp.CPUMicros})
		}
	}
	return out
}

// hopBudget is the P/D hop's allowance beyond one nginx hop, in ms.
const hopBudget = 0.05

// hopBudgetLine holds the disaggregated path's TTFT beyond the floor (the
// two legs pd-bench runs itself) against what one nginx hop adds to the
// engine's, p50 of the open-loop run: the split's hop may cost at most an
// nginx hop plus hopBudget (no line without nginx and the floor).
func hopBudgetLine(open loadgen.Report) (budgetLine, bool) {
	d, okD := find(open, "direct")
	n, okN := find(open, "nginx")
	f, okF := find(open, "floor")
	p, okP := find(open, "sidecar-pd")
	if !okD || !okN || !okF || !okP {
		return budgetLine{}, false
	}
	hop, nginx := p.TTFT.P50-f.TTFT.P50, n.TTFT.P50-d.TTFT.P50
	return budgetLine{met: hop <= nginx+hopBudget,
		line: fmt.Sprintf("disaggregated hop within %.2f ms of the floor plus one nginx hop (p50): sidecar-pd %+.3f ms over the floor, nginx %+.3f ms over direct (%+.3f ms beyond it)",
			hopBudget, hop, nginx, hop-nginx)}, true
}

func (r *report) writeJSON(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return err
	}
	return f.Close()
}
