package tailbench

import (
	"context"
	"fmt"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// killRun is what one run of scenario 4 saw.
type killRun struct {
	probe time.Duration
	sum   loadgen.Summary
	// down is the kill, up the restarted engine's first 200 on /health,
	// end the end of the load.
	down, up, end time.Time
	// gap is from up to the first prefill the restarted engine did for a
	// split (resumed false: none before the load ended).
	gap     time.Duration
	resumed bool
	// Sidecar counters at the end.
	probes, fallbacks float64
}

// runKill is scenario 4: two prefillers, the sidecar picking one at random
// per request; one is killed (SIGKILL) and restarted on the same ports
// while the load runs. Once with --circuit-probe-interval, once with 0.
func runKill(ctx context.Context, o Options, r *rig) ([]Line, error) {
	fmt.Fprintf(o.Out, "\n== 4. A prefiller killed for %v under %.0f req/s ==\n", o.KillDown, o.KillRate)
	fmt.Fprintf(o.Out, "workload: chat, %d-token prompts, %d output tokens; open loop, %.0f req/s Poisson; two prefillers (--enable-prefiller-sampling: one at random per request);\n"+
		"one killed with SIGKILL %v into the load, restarted on the same ports %v later, load for %v more; circuit: %d failures, %v cooldown\n",
		o.ShortTokens, o.OutputTokens, o.KillRate, o.KillBefore, o.KillDown, o.KillAfter, o.CircuitFailures, o.CircuitCooldown)
	var runs []killRun
	for i, probe := range []time.Duration{o.ProbeInterval, 0} {
		kr, err := killOnce(ctx, o, r, i, probe)
		r.stop() // each run has processes of its own
		if err != nil {
			return nil, err
		}
		runs = append(runs, kr)
	}
	fmt.Fprintf(o.Out, "%-22s %8s %8s %10s %10s %12s %10s\n", "circuit probing", "ok", "errors", "TTFT p50", "p99", "splits back", "fallbacks")
	for _, kr := range runs {
		name := fmt.Sprintf("every %v", kr.probe)
		if kr.probe == 0 {
			name = "off (0)"
		}
		fmt.Fprintf(o.Out, "%-22s %8d %8d %10s %10s %12s %10.0f\n", name, kr.sum.OK, kr.sum.Requests-kr.sum.OK,
			num(kr.sum.TTFT.P50, "ms"), num(kr.sum.TTFT.P99, "ms"), gapText(kr), kr.fallbacks)
	}
	fmt.Fprintln(o.Out, "(splits back: from the restarted engine's first 200 on /health to its first prefill for a split, polled every 20 ms)")
	p, c := runs[0], runs[1]
	errs := func(kr killRun) int { return kr.sum.Requests - kr.sum.OK }
	return []Line{
		{Scenario: 4, Budget: "no request fails (every answer 200)", Met: errs(p) == 0 && errs(c) == 0,
			Measured: fmt.Sprintf("%d errors of %d (probing), %d of %d (control)%s", errs(p), p.sum.Requests, errs(c), c.sum.Requests, errorKinds(p, c))},
		{Scenario: 4, Budget: fmt.Sprintf("splits resume ≤ 1 s after it returns (probe %v)", p.probe), Met: p.resumed && p.gap <= time.Second,
			Measured: fmt.Sprintf("%s; %.0f probes", gapText(p), p.probes)},
		{Scenario: 4, Info: true, Budget: "splits resume, probing off", Measured: gapText(c)},
	}, nil
}

func gapText(kr killRun) string {
	if !kr.resumed {
		return fmt.Sprintf("none in the %.2f s of load after it returned", kr.end.Sub(kr.up).Seconds())
	}
	return fmt.Sprintf("%.0f ms", msOf(kr.gap))
}

func errorKinds(runs ...killRun) string {
	s := ""
	for _, kr := range runs {
		for k, n := range kr.sum.Errors {
			s += fmt.Sprintf("; %s: %d", k, n)
		}
	}
	return s
}

func killOnce(ctx context.Context, o Options, r *rig, i int, probe time.Duration) (killRun, error) {
	kr := killRun{probe: probe}
	victim, err := r.engine(ctx, fmt.Sprintf("prefill-a-%d", i), "prefill")
	if err != nil {
		return kr, err
	}
	other, err := r.engine(ctx, fmt.Sprintf("prefill-b-%d", i), "prefill")
	if err != nil {
		return kr, err
	}
	d, err := r.engine(ctx, fmt.Sprintf("decode-%d", i), "decode")
	if err != nil {
		return kr, err
	}
	s, err := r.sidecar(ctx, fmt.Sprintf("probe-%v", probe), d, "--enable-prefiller-sampling",
		"--circuit-probe-interval", probe.String(), "--circuit-breaker-failures", itoa(o.CircuitFailures),
		"--circuit-breaker-cooldown", o.CircuitCooldown.String())
	if err != nil {
		return kr, err
	}
	total := o.KillBefore + o.KillDown + o.KillAfter
	reqs := workload(uint64(40+i), int(o.KillRate*total.Seconds()*1.5)+64, o.ShortTokens, o.OutputTokens)
	target := loadgen.Target{Name: "kill", URL: s.url(), Prefiller: victim.hostPort() + "," + other.hostPort()}
	load := loadgen.Load{Rate: o.KillRate, Poisson: true, Duration: total, Rounds: 1, Timeout: 30 * time.Second}
	type loadOut struct {
		res []*loadgen.TargetResults
		err error
	}
	done := make(chan loadOut, 1)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		res, err := loadgen.Run(lctx, loadgen.APIChat, []loadgen.Target{target}, reqs, load, nil)
		done <- loadOut{res, err}
	}()
	wait := func() (loadOut, error) {
		select {
		case lo := <-done:
			return lo, nil
		case <-ctx.Done():
			return loadOut{}, ctx.Err()
		}
	}
	if !sleepCtx(ctx, o.KillBefore) {
		return kr, ctx.Err()
	}
	kr.down = time.Now()
	r.kill(victim.p)
	if !sleepCtx(ctx, o.KillDown) {
		return kr, ctx.Err()
	}
	if err := r.restart(ctx, victim); err != nil { // restart polls /health every 30 ms
		cancel()
		_, _ = wait()
		return kr, fmt.Errorf("restart: %w", err)
	}
	kr.up = time.Now()
	// Poll the restarted engine's split prefills until one shows or the
	// load ends.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var lo loadOut
	finished := false
	for !kr.resumed && !finished {
		select {
		case lo = <-done:
			finished, kr.end = true, time.Now()
		case <-tick.C:
		case <-ctx.Done():
			return kr, ctx.Err()
		}
		n, err := metricValue(ctx, victim.metrics(), "sim_remote_decode_prefills_total")
		if err == nil && n > 0 {
			kr.gap, kr.resumed = time.Since(kr.up), true
		}
	}
	if !finished {
		if lo, err = wait(); err != nil {
			return kr, err
		}
		kr.end = time.Now()
	}
	if lo.err != nil {
		return kr, fmt.Errorf("load: %w", lo.err)
	}
	kr.sum = loadgen.Summarize(lo.res[0])
	m, err := scrape(ctx, s.metrics())
	if err != nil {
		return kr, err
	}
	kr.probes = m.value("pd_sidecar_circuit_probes_total")
	kr.fallbacks = m.value("pd_sidecar_fallbacks_total")
	return kr, nil
}
