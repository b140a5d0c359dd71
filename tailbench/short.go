package tailbench

import (
	"context"
	"fmt"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// runShort is scenario 3: short prompts naming a prefiller, declined by
// --min-remote-prefill-tokens, against the same prompts with no header,
// both through the same sidecar and decode engine.
func runShort(ctx context.Context, o Options, r *rig) ([]Line, error) {
	fmt.Fprintf(o.Out, "\n== 3. Short prompts under the guard (--min-remote-prefill-tokens %d) ==\n", o.GuardTokens)
	p, err := r.engine(ctx, "prefill", "prefill")
	if err != nil {
		return nil, err
	}
	d, err := r.engine(ctx, "decode", "decode")
	if err != nil {
		return nil, err
	}
	s, err := r.sidecar(ctx, "guard", d, "--min-remote-prefill-tokens", itoa(o.GuardTokens))
	if err != nil {
		return nil, err
	}
	targets := []loadgen.Target{
		{Name: "local", URL: s.url()},
		{Name: "guarded", URL: s.url(), Prefiller: p.hostPort()},
	}
	const rounds = 2
	n := int(o.ShortRate*o.ShortDuration.Seconds()*rounds*2*1.5) + 64
	reqs := workload(3, n, o.ShortTokens, o.OutputTokens)
	// No warm-up: every request of the guarded target is counted, so the
	// declines can be compared with them.
	load := loadgen.Load{Rate: o.ShortRate, Poisson: true, Duration: o.ShortDuration, Rounds: rounds, Timeout: 30 * time.Second}
	res, err := loadgen.Run(ctx, loadgen.APIChat, targets, reqs, load, progress(o))
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	rep := loadgen.Report{
		Workload: fmt.Sprintf("chat, %d-token prompts, %d output tokens, streamed; same sidecar and decode engine, guarded with the header, local without", o.ShortTokens, o.OutputTokens),
		Load:     fmt.Sprintf("open loop, %.0f req/s Poisson, %d rounds × %v per target (interleaved), no warm-up", o.ShortRate, rounds, o.ShortDuration)}
	for _, t := range res {
		rep.Targets = append(rep.Targets, loadgen.Summarize(t))
	}
	if err := rep.WriteTable(o.Out); err != nil {
		return nil, err
	}
	local, guarded := rep.Targets[0], rep.Targets[1]
	sm, err := scrape(ctx, s.metrics())
	if err != nil {
		return nil, err
	}
	prefills, err := metricValue(ctx, p.metrics(), "sim_remote_decode_prefills_total")
	if err != nil {
		return nil, err
	}
	declined := sm.value("pd_sidecar_split_declined_total", "reason", "short_prompt")
	fmt.Fprintf(o.Out, "guard: %.0f declined (short_prompt) of %d guarded requests; modes: local %.0f, disaggregated %.0f, fallback %.0f; prefiller's sim_remote_decode_prefills_total %.0f\n",
		declined, guarded.Requests, sm.value("pd_sidecar_requests_total", "mode", "local"),
		sm.value("pd_sidecar_requests_total", "mode", "disaggregated"), sm.value("pd_sidecar_requests_total", "mode", "fallback"), prefills)
	// Within noise: 15 % apart, or 2 ms (p50) and 5 ms (p99) apart: at a
	// few milliseconds a request, loopback jitter is that large.
	return []Line{
		{Scenario: 3, Budget: "guarded TTFT p50 = local within noise (±15% or 2 ms)",
			Met:      withinNoise(guarded.TTFT.P50, local.TTFT.P50, 0.15, 2),
			Measured: fmt.Sprintf("%s vs %s (%.2f×)", num(guarded.TTFT.P50, "ms"), num(local.TTFT.P50, "ms"), ratio(guarded.TTFT.P50, local.TTFT.P50))},
		{Scenario: 3, Budget: "guarded TTFT p99 = local within noise (±15% or 5 ms)",
			Met:      withinNoise(guarded.TTFT.P99, local.TTFT.P99, 0.15, 5),
			Measured: fmt.Sprintf("%s vs %s (%.2f×)", num(guarded.TTFT.P99, "ms"), num(local.TTFT.P99, "ms"), ratio(guarded.TTFT.P99, local.TTFT.P99))},
		{Scenario: 3, Budget: "declines = guarded requests; prefiller unused",
			Met:      declined == float64(guarded.Requests) && prefills == 0 && guarded.OK == guarded.Requests,
			Measured: fmt.Sprintf("%.0f declined of %d requests (%d ok); prefiller prefills %.0f", declined, guarded.Requests, guarded.OK, prefills)},
	}, nil
}
