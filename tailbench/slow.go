package tailbench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// workload builds n distinct chat requests of prompt words (one token each
// in engine-sim) and output tokens, streamed. Distinct prompts: no prefix
// cache hides a prefill.
func workload(seed uint64, n, prompt, output int) []loadgen.Request {
	w := loadgen.Workload{API: loadgen.APIChat, Model: "sim-model", Stream: true, Seed: seed, Distinct: n,
		PromptTokens: loadgen.Dist{Min: prompt, Max: prompt}, OutputTokens: loadgen.Dist{Min: output, Max: output}}
	return w.Generate()
}

// progress prints a phase's progress on one line of stderr-like output.
func progress(o Options) loadgen.Progress {
	return func(round, rounds int, target string, done int) {
		fmt.Fprintf(o.Out, "  round %d/%d  %-14s %6d requests\n", round, rounds, target, done)
	}
}

// runSlow is scenario 1: one prefiller of four slow.
func runSlow(ctx context.Context, o Options, r *rig) ([]Line, error) {
	slowPlan, err := json.Marshal(map[string]any{"slow_share": o.SlowShare, "slow_ms": o.SlowDelay.Milliseconds(), "slow_seed": 7, "only": "prefill"})
	if err != nil {
		return nil, fmt.Errorf("slow plan: %w", err)
	}
	fmt.Fprintf(o.Out, "\n== 1. One prefiller of four slow (%.0f%% of its prefills +%v) ==\n", o.SlowShare*100, o.SlowDelay)
	// Four healthy prefillers and a slow fifth that replaces the fourth in
	// the slow sets: each target is driven alone (interleaved), so the
	// healthy ones serve every P/D target in turn.
	var healthy []string
	for i := 1; i <= 4; i++ {
		e, err := r.engine(ctx, fmt.Sprintf("prefill-%d", i), "prefill")
		if err != nil {
			return nil, err
		}
		healthy = append(healthy, e.hostPort())
	}
	slow, err := r.engine(ctx, "prefill-slow", "prefill", "--faults", string(slowPlan))
	if err != nil {
		return nil, err
	}
	withSlow := append(append([]string{}, healthy[:3]...), slow.hostPort())
	// A decode engine and a sidecar per target, so that each engine's
	// counters are that target's. Every sidecar picks a prefiller at
	// random among those the header lists.
	type leg struct {
		name      string
		prefiller string
		flags     []string
	}
	hedgeFlags := []string{"--prefill-hedge-after", o.HedgeAfter, "--prefill-hedge-budget", ftoa(o.HedgeBudget)}
	legs := []leg{
		{"local-only", "", nil},
		{"pd-healthy", strings.Join(healthy, ","), nil},
		{"pd-slow", strings.Join(withSlow, ","), nil},
		{"pd-slow-hedged", strings.Join(withSlow, ","), hedgeFlags},
	}
	var targets []loadgen.Target
	decodes := map[string]*engine{}
	sidecars := map[string]*sidecar{}
	for _, l := range legs {
		d, err := r.engine(ctx, "decode-"+l.name, "decode")
		if err != nil {
			return nil, err
		}
		s, err := r.sidecar(ctx, l.name, d, append([]string{"--enable-prefiller-sampling"}, l.flags...)...)
		if err != nil {
			return nil, err
		}
		decodes[l.name], sidecars[l.name] = d, s
		targets = append(targets, loadgen.Target{Name: l.name, URL: s.url(), Prefiller: l.prefiller})
	}
	perTarget := o.Rate * (o.Duration.Seconds()*float64(o.Rounds) + o.Warmup.Seconds())
	reqs := workload(1, int(perTarget*float64(len(targets))*1.5)+64, o.PromptTokens, o.OutputTokens)
	load := loadgen.Load{Rate: o.Rate, Poisson: true, Duration: o.Duration, Rounds: o.Rounds, Warmup: o.Warmup, Timeout: 60 * time.Second}
	prefill := time.Duration(o.PromptTokens) * o.PrefillPerToken
	fmt.Fprintf(o.Out, "local-only keeps its decode engine %.0f%% busy prefilling (rate × prefill, one prefill slot); each prefiller of a P/D target %.0f%%\n",
		100*o.Rate*prefill.Seconds()/float64(max(1, o.PrefillSlots)), 100*o.Rate*prefill.Seconds()/4/float64(max(1, o.PrefillSlots)))
	fmt.Fprintf(o.Out, "hedging: --prefill-hedge-after %s --prefill-hedge-budget %s on pd-slow-hedged only\n", o.HedgeAfter, ftoa(o.HedgeBudget))
	res, err := loadgen.Run(ctx, loadgen.APIChat, targets, reqs, load, progress(o))
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	rep := loadgen.Report{
		Workload: fmt.Sprintf("chat, %d-token prompts (prefill %v), %d output tokens, streamed", o.PromptTokens, prefill, o.OutputTokens),
		Load:     fmt.Sprintf("open loop, %.1f req/s Poisson, %d rounds × %v per target (interleaved), %v warm-up", o.Rate, o.Rounds, o.Duration, o.Warmup)}
	sum := map[string]loadgen.Summary{}
	for _, t := range res {
		s := loadgen.Summarize(t)
		sum[s.Name] = s
		rep.Targets = append(rep.Targets, s)
	}
	if err := rep.WriteTable(o.Out); err != nil {
		return nil, err
	}

	hm, err := scrape(ctx, sidecars["pd-slow-hedged"].metrics())
	if err != nil {
		return nil, err
	}
	dm, err := scrape(ctx, decodes["pd-slow-hedged"].metrics())
	if err != nil {
		return nil, err
	}
	um, err := scrape(ctx, sidecars["pd-slow"].metrics())
	if err != nil {
		return nil, err
	}
	sm, err := scrape(ctx, slow.metrics())
	if err != nil {
		return nil, err
	}
	splits := hm.value("pd_sidecar_requests_total") // every request of this target names prefillers, warm-up included
	hedges := hm.value("pd_sidecar_hedges_total")
	localWins := hm.value("pd_sidecar_hedges_total", "winner", "local")
	decodePrefills := dm.value("sim_prefills_computed_total")
	allowance := hedgeAllowance(splits, o.HedgeBudget, 10)
	fmt.Fprintf(o.Out, "slow prefiller: %.0f prefills slowed (pd-slow and pd-slow-hedged together, of %.0f prefill legs it served)\n",
		sm.value("sim_faults_injected_total", "kind", "slow"), sm.value("vllm:request_success_total")+sm.value("sim_requests_cancelled_total"))
	fmt.Fprintf(o.Out, "pd-slow (no hedging): fallbacks %.0f\n", um.value("pd_sidecar_fallbacks_total"))
	fmt.Fprintf(o.Out, "pd-slow-hedged: %.0f split requests, hedges %.0f (remote won %.0f, local won %.0f), denied %.0f, wasted s remote %.2f local %.2f, fallbacks{slow_prefill} %.0f\n",
		splits, hedges, hm.value("pd_sidecar_hedges_total", "winner", "remote"), localWins,
		hm.value("pd_sidecar_hedges_denied_total"),
		hm.value("pd_sidecar_hedge_wasted_seconds_total", "leg", "remote"), hm.value("pd_sidecar_hedge_wasted_seconds_total", "leg", "local"),
		hm.value("pd_sidecar_fallbacks_total", "reason", "slow_prefill"))
	fmt.Fprintf(o.Out, "  its decode engine: %.0f prefills computed, %.0f local requests cancelled (lost hedges), %.0f remote-KV decodes\n",
		decodePrefills, dm.value("sim_requests_cancelled_total", "kind", "local"), dm.value("sim_remote_kv_decodes_total"))

	hp99, bp99, lp99 := sum["pd-slow-hedged"].TTFT.P99, sum["pd-healthy"].TTFT.P99, sum["local-only"].TTFT.P99
	lines := []Line{
		atMost(1, "hedged TTFT p99 ≤ 1.3× healthy P/D p99", hp99, bp99, 1.3, "ms"),
		atMost(1, "hedged TTFT p99 ≤ local-only p99", hp99, lp99, 1, "ms"),
		{Scenario: 1, Info: true, Budget: "P/D with the slow prefiller, no hedging (TTFT p99)",
			Measured: fmt.Sprintf("%s (%.2f× healthy P/D)", num(sum["pd-slow"].TTFT.P99, "ms"), ratio(sum["pd-slow"].TTFT.P99, bp99))},
		{Scenario: 1, Budget: "hedges ≤ budget (10% of splits + burst 10)", Met: hedges <= allowance,
			Measured: fmt.Sprintf("%.0f hedges (sidecar) of %.0f splits; allowed %.1f", hedges, splits, allowance)},
		{Scenario: 1, Budget: "decode-engine prefills ≤ budget", Met: decodePrefills <= allowance,
			Measured: fmt.Sprintf("%.0f prefills computed (engine counter); allowed %.1f", decodePrefills, allowance)},
	}
	for _, name := range []string{"local-only", "pd-healthy", "pd-slow", "pd-slow-hedged"} {
		if s := sum[name]; s.OK != s.Requests {
			lines = append(lines, Line{Scenario: 1, Budget: name + ": every request answered", Measured: fmt.Sprintf("%d of %d ok: %v", s.OK, s.Requests, s.Errors)})
		}
	}
	return lines, nil
}
