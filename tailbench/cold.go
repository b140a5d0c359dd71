package tailbench

import (
	"context"
	"fmt"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// runCold is scenario 2: a prefiller the decode engine never pulled from,
// its first NIXL pull paying --kv-handshake-delay; with --prefill-prewarm
// the sidecar warms it at start (a static allowlist entry), without it the
// first request pays the handshake.
func runCold(ctx context.Context, o Options, r *rig) ([]Line, error) {
	fmt.Fprintf(o.Out, "\n== 2. Cold prefiller (decode engine --kv-handshake-delay %v) ==\n", o.HandshakeDelay)
	p, err := r.engine(ctx, "prefill", "prefill")
	if err != nil {
		return nil, err
	}
	reqs := workload(2, 2*(o.WarmRequests+1), o.PromptTokens, o.OutputTokens)
	type run struct {
		first, warm time.Duration
		handshakes  float64
		warmUp      time.Duration
	}
	measure := func(name string, prewarm bool, reqs []loadgen.Request) (run, error) {
		var out run
		d, err := r.engine(ctx, "decode-"+name, "decode", "--kv-handshake-delay", o.HandshakeDelay.String())
		if err != nil {
			return out, err
		}
		flags := []string{"--enable-ssrf-protection", "--prefiller-allowlist", p.hostPort()}
		if prewarm {
			// One sidecar: nothing to spread its warm-up against.
			flags = append(flags, "--prefill-prewarm", "--prefill-prewarm-spread", "0s")
		}
		start := time.Now()
		s, err := r.sidecar(ctx, name, d, flags...)
		if err != nil {
			return out, err
		}
		if prewarm {
			// The allowlist entry is warmed at start: wait for it.
			deadline := time.Now().Add(o.HandshakeDelay + 20*time.Second)
			for {
				ok, err := metricValue(ctx, s.metrics(), "pd_sidecar_prewarms_total", "result", "ok")
				if err != nil {
					return out, err
				}
				if ok >= 1 {
					break
				}
				if time.Now().After(deadline) {
					return out, fmt.Errorf("%s: no pd_sidecar_prewarms_total{result=\"ok\"} within %v", s.name, time.Since(start))
				}
				if !sleepCtx(ctx, 20*time.Millisecond) {
					return out, ctx.Err()
				}
			}
			out.warmUp = time.Since(start)
		}
		c := loadgen.NewClient(loadgen.Target{Name: name, URL: s.url(), Prefiller: p.hostPort()}, loadgen.APIChat, 30*time.Second)
		defer c.Close()
		var warm []time.Duration
		for i, rq := range reqs {
			res := c.Send(ctx, rq.Body)
			if res.Err != "" {
				return out, fmt.Errorf("%s: request %d: %s", name, i, res.Err)
			}
			if i == 0 {
				out.first = res.TTFT
			} else {
				warm = append(warm, res.TTFT)
			}
		}
		out.warm = loadgen.Median(warm)
		m, err := scrape(ctx, d.metrics())
		if err != nil {
			return out, err
		}
		out.handshakes = m.value("sim_kv_handshakes_total")
		if got := m.value("sim_remote_kv_decodes_total"); got < float64(len(reqs)) {
			return out, fmt.Errorf("%s: %v of %d requests decoded on remote KV: not every request was split", name, got, len(reqs))
		}
		return out, nil
	}
	warmed, err := measure("prewarm", true, reqs[:o.WarmRequests+1])
	if err != nil {
		return nil, err
	}
	cold, err := measure("no-prewarm", false, reqs[o.WarmRequests+1:])
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Out, "workload: chat, %d-token prompts, one request at a time: the first, then %d warm ones (median)\n", o.PromptTokens, o.WarmRequests)
	fmt.Fprintf(o.Out, "%-12s %12s %14s %8s %11s %14s\n", "sidecar", "first TTFT", "warm TTFT p50", "ratio", "handshakes", "warm-up done")
	for _, x := range []struct {
		name string
		r    run
	}{{"prewarm", warmed}, {"no-prewarm", cold}} {
		wu := "-"
		if x.r.warmUp > 0 {
			wu = fmt.Sprintf("%.2f s", x.r.warmUp.Seconds())
		}
		fmt.Fprintf(o.Out, "%-12s %12s %14s %7.2f× %11.0f %14s\n", x.name, num(msOf(x.r.first), "ms"), num(msOf(x.r.warm), "ms"),
			ratio(msOf(x.r.first), msOf(x.r.warm)), x.r.handshakes, wu)
	}
	fmt.Fprintf(o.Out, "(warm-up done: from the sidecar's start to pd_sidecar_prewarms_total{result=\"ok\"} = 1; handshakes: the decode engine's sim_kv_handshakes_total, the warm-up's included)\n")
	return []Line{
		atMost(2, "prewarmed: first TTFT ≤ 1.2× warm median", msOf(warmed.first), msOf(warmed.warm), 1.2, "ms"),
		{Scenario: 2, Info: true, Budget: "no prewarm: first TTFT (pays the handshake)",
			Measured: fmt.Sprintf("%s vs warm %s (%.1f×)", num(msOf(cold.first), "ms"), num(msOf(cold.warm), "ms"), ratio(msOf(cold.first), msOf(cold.warm)))},
	}, nil
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
