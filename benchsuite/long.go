package benchsuite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// LongOptions shapes the long-prompt scenario: one open-loop run per
// prompt length, every target interleaved in it, each proxy's CPU read
// around its own target's phases, so its cost per request and per MB of
// body is its own.
type LongOptions struct {
	// Words lists the prompt lengths, in words (engine-sim's tokenizer
	// counts a word as one token); none skips the scenario.
	Words []int
	// Rate is the open-loop arrival rate (Poisson) per target.
	Rate float64
	// Duration and Rounds shape each length's run; Warmup is sent to every
	// target before it and not measured.
	Duration time.Duration
	Rounds   int
	Warmup   time.Duration
	// Distinct is the number of distinct bodies per length (cycled).
	Distinct int
}

// Validate checks the options of a scenario that runs.
func (o LongOptions) Validate() error {
	if len(o.Words) == 0 {
		return nil
	}
	for _, n := range o.Words {
		if n < 1 {
			return fmt.Errorf("long-prompt length %d: must be positive", n)
		}
	}
	switch {
	case o.Rate <= 0:
		return errors.New("long-prompt rate must be positive")
	case o.Duration <= 0 || o.Rounds < 1:
		return errors.New("long-prompt duration must be positive and rounds at least 1")
	}
	return nil
}

// budgetWords is the prompt length the long-prompt budget is stated for:
// 30,000 words, a ~200 KB chat body.
const budgetWords = 30000

// longWorkload is the chat workload of one prompt length: streamed, 16
// output tokens, distinct prompts of exactly words words.
func longWorkload(words, distinct int) loadgen.Workload {
	return loadgen.Workload{API: loadgen.APIChat, Model: "sim-model", Stream: true,
		PromptTokens: loadgen.Dist{Min: words, Max: words}, OutputTokens: loadgen.Dist{Min: 16, Max: 16},
		Seed: uint64(words), Distinct: max(distinct, 1)}
}

// longRun is the result of one prompt length.
type longRun struct {
	Words  int            `json:"prompt_words"`
	BodyKB float64        `json:"mean_body_kb"`
	Report loadgen.Report `json:"report"`
	Costs  []longCost     `json:"proxy_costs"`
}

// longCost is one proxy's CPU over one prompt length's run.
type longCost struct {
	Proxy    string  `json:"proxy"`
	Requests int     `json:"requests"`
	BodyMB   float64 `json:"body_mb"`
	// CPUMicros is µs of CPU per request, CPUPerMB ms of CPU per MB (10^6
	// bytes) of request body.
	CPUMicros float64 `json:"cpu_us_per_request"`
	CPUPerMB  float64 `json:"cpu_ms_per_mb"`
	// CPUMicrosRun is µs of CPU per request over the whole length's run,
	// the other targets' phases included (the proxy idle, and what its
	// collector and scavenger do after its own phases).
	CPUMicrosRun float64 `json:"cpu_us_per_request_whole_run"`
}

// perBody divides cpu by the requests and by the MB (10^6 bytes) of body
// they carried: µs per request and ms per MB (0 where nothing was sent).
func perBody(cpu time.Duration, requests int, bytes int64) (usPerRequest, msPerMB float64) {
	if requests > 0 {
		usPerRequest = float64(cpu) / float64(time.Microsecond) / float64(requests)
	}
	if bytes > 0 {
		msPerMB = float64(cpu) / float64(time.Millisecond) / (float64(bytes) / 1e6)
	}
	return usPerRequest, msPerMB
}

func meanBodyKB(reqs []loadgen.Request) float64 {
	if len(reqs) == 0 {
		return 0
	}
	n := 0
	for _, r := range reqs {
		n += len(r.Body)
	}
	return float64(n) / float64(len(reqs)) / 1e3
}

// runLong runs the long-prompt scenario and writes its tables.
func runLong(ctx context.Context, o LongOptions, w io.Writer, proxies []proxyUnderTest, targets []loadgen.Target, rep *report) error {
	if err := o.Validate(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nlong prompts: chat, 16 output tokens, SSE, open loop %.0f req/s Poisson, %d rounds × %v per target and length\n",
		o.Rate, o.Rounds, o.Duration)
	for _, words := range o.Words {
		reqs := longWorkload(words, o.Distinct).Generate()
		if o.Warmup > 0 {
			warm := loadgen.Load{Rate: o.Rate, Poisson: true, Duration: o.Warmup, Rounds: 1}
			if _, err := loadgen.Run(ctx, loadgen.APIChat, targets, reqs, warm, nil); err != nil {
				return fmt.Errorf("%d words, warm-up: %w", words, err)
			}
		}
		// Each proxy's CPU is read around its own target's phases (the
		// phases are interleaved), exactly where the kernel allows
		// (procUsage.busy): a phase of a few seconds is a few hundred
		// clock ticks, and what utime+stime charge a process at rest while
		// the others are driven is not counted against its requests.
		own := map[string]time.Duration{}
		before := usageOf(proxies)
		last, shown := before, progress(w)
		phase := func(round, rounds int, target string, done int) {
			now := usageOf(proxies)
			if u, ok := now[target]; ok {
				own[target] += max(u.busy()-last[target].busy(), 0)
			}
			last = now
			shown(round, rounds, target, done)
		}
		load := loadgen.Load{Rate: o.Rate, Poisson: true, Duration: o.Duration, Rounds: o.Rounds}
		res, err := loadgen.Run(ctx, loadgen.APIChat, targets, reqs, load, phase)
		if err != nil {
			return fmt.Errorf("%d words: %w", words, err)
		}
		after := usageOf(proxies)
		run := longRun{Words: words, BodyKB: meanBodyKB(reqs),
			Report: loadgen.Report{Workload: fmt.Sprintf("chat, %d-word prompts (%.0f KB bodies), 16 output tokens, SSE", words, meanBodyKB(reqs)),
				Load: fmt.Sprintf("open loop %.0f req/s", o.Rate)}}
		for _, t := range res {
			run.Report.Targets = append(run.Report.Targets, loadgen.Summarize(t))
		}
		for _, px := range proxies {
			s, _ := find(run.Report, px.name)
			c := longCost{Proxy: px.name, Requests: s.Requests, BodyMB: float64(s.BodyBytes) / 1e6}
			c.CPUMicros, c.CPUPerMB = perBody(own[px.name], s.Requests, s.BodyBytes)
			c.CPUMicrosRun, _ = perBody(after[px.name].CPU-before[px.name].CPU, s.Requests, s.BodyBytes)
			run.Costs = append(run.Costs, c)
		}
		rep.Long = append(rep.Long, run)
		fmt.Fprintln(w)
		writeLongTable(w, run)
	}
	return nil
}

// writeLongTable writes one length's targets: TTFT, and each proxy's CPU
// per request and per MB of body.
func writeLongTable(w io.Writer, r longRun) {
	fmt.Fprintf(w, "%d-word prompts (%.0f KB bodies)\n", r.Words, r.BodyKB)
	direct, _ := find(r.Report, "direct")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tok\terrors\tTTFT p50\tp99\tΔTTFT p50\tΔp99\tCPU µs/request\tCPU ms/MB\twhole run µs/req\t")
	for _, s := range r.Report.Targets {
		cpu, perMB, whole := "–", "–", "–"
		if c, ok := findLongCost(r.Costs, s.Name); ok {
			cpu, perMB, whole = fmt.Sprintf("%.0f", c.CPUMicros), fmt.Sprintf("%.2f", c.CPUPerMB), fmt.Sprintf("%.0f", c.CPUMicrosRun)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.3f\t%.3f\t%+.3f\t%+.3f\t%s\t%s\t%s\t\n", s.Name, s.OK, s.Requests-s.OK,
			s.TTFT.P50, s.TTFT.P99, s.TTFT.P50-direct.TTFT.P50, s.TTFT.P99-direct.TTFT.P99, cpu, perMB, whole)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "(TTFT in ms, Δ over direct; CPU: time on a CPU of the proxy's process tree over its own target's phases, per request sent;")
	fmt.Fprintln(w, " whole run: utime+stime over the length's whole run, the other targets' phases included)")
}

func findLongCost(cs []longCost, name string) (longCost, bool) {
	for _, c := range cs {
		if c.Proxy == name {
			return c, true
		}
	}
	return longCost{}, false
}

// longBudgetLines states the long-prompt budget against the run of
// budgetWords words (none when it was not run).
func longBudgetLines(runs []longRun) []budgetLine {
	var r *longRun
	for i := range runs {
		if runs[i].Words == budgetWords {
			r = &runs[i]
		}
	}
	if r == nil {
		return nil
	}
	var out []budgetLine
	ng, okNG := findLongCost(r.Costs, "nginx")
	d, okD := find(r.Report, "direct")
	n, okN := find(r.Report, "nginx")
	// Each line for the sidecars as run with every processor, and as the
	// chart deploys them by default (GOMAXPROCS=1), where they were run.
	for _, v := range []struct{ local, pd, note string }{
		{"sidecar", "sidecar-pd", ""},
		{"sidecar-1p", "sidecar-pd-1p", " (GOMAXPROCS=1, as the chart deploys it)"},
	} {
		sc, okSC := findLongCost(r.Costs, v.local)
		if okSC && okNG && ng.CPUMicros > 0 {
			out = append(out, budgetLine{met: sc.CPUMicros <= 1.2*ng.CPUMicros,
				line: fmt.Sprintf("%dk-word passthrough CPU per request ≤ 1.2× nginx%s: %.2f× (%.0f vs %.0f µs)",
					r.Words/1000, v.note, sc.CPUMicros/ng.CPUMicros, sc.CPUMicros, ng.CPUMicros)})
		}
		if s, okS := find(r.Report, v.local); okD && okS && okN {
			as, an := s.TTFT.P50-d.TTFT.P50, n.TTFT.P50-d.TTFT.P50
			out = append(out, budgetLine{met: as <= an+0.1,
				line: fmt.Sprintf("%dk-word passthrough added TTFT p50 ≤ nginx's + 0.1 ms%s: %+.3f vs %+.3f ms", r.Words/1000, v.note, as, an)})
		}
		if pd, okPD := findLongCost(r.Costs, v.pd); okPD && okNG && ng.CPUMicros > 0 {
			out = append(out, budgetLine{met: pd.CPUMicros <= 2.5*ng.CPUMicros,
				line: fmt.Sprintf("%dk-word P/D split CPU per request ≤ 2.5× nginx's passthrough%s: %.2f× (%.0f vs %.0f µs)",
					r.Words/1000, v.note, pd.CPUMicros/ng.CPUMicros, pd.CPUMicros, ng.CPUMicros)})
		}
	}
	pd, okPD := findLongCost(r.Costs, "sidecar-pd")
	if peer, ok := findLongCost(r.Costs, "peer-pd"); ok && okPD && pd.CPUMicros > 0 {
		out = append(out, budgetLine{met: peer.CPUMicros >= 3*pd.CPUMicros,
			line: fmt.Sprintf("%dk-word P/D split ≥ 3× less CPU than the peer's: %.2f× (%.0f vs %.0f µs)",
				r.Words/1000, peer.CPUMicros/pd.CPUMicros, pd.CPUMicros, peer.CPUMicros)})
	}
	return out
}
