package tailbench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// blockSample is the prefillers' sim_kv_blocks_held (summed) at a moment.
type blockSample struct {
	at   time.Time
	held float64
}

// leaveRun is what one run of scenario 5 saw.
type leaveRun struct {
	release bool
	sum     loadgen.Summary
	// clientTokens is every token the clients got, those that left
	// included (none when they left before any output).
	clientTokens int
	// arrivalsEnd is the load's end (no request is sent after it);
	// finished is when its last request ended (answered or left).
	arrivalsEnd, finished time.Time
	// samples is sim_kv_blocks_held every 20 ms from the load's start to
	// the end of the watch.
	samples []blockSample
	// The sidecar's pd_sidecar_kv_releases_total by how, and its client
	// disconnects.
	releases, releaseFailed, releaseOverLimit, disconnects float64
	// The decode engine's generation tokens, KV reads and cancelled
	// decode legs; the prefillers' holds made and holds the lease ended.
	genTokens, pulls, cancelledDecodes float64
	holds, leaseExpired                float64
}

// releaseLegs is the release legs the sidecar sent (each reads the KV and
// makes at most one token; a failed one may have made it).
func (lr leaveRun) releaseLegs() float64 { return lr.releases + lr.releaseFailed }

// stranded is the holds no decode read: the KV the prefillers keep until
// their lease.
func (lr leaveRun) stranded() float64 { return lr.holds - lr.pulls }

// settled is how long after ref the blocks held were back to 0 for good:
// the first sample from which every later one reads 0. ok is false when
// the last sample is not 0 (still held at the end of the watch). A time
// before ref reads 0.
func settled(samples []blockSample, ref time.Time) (after time.Duration, ok bool) {
	if len(samples) == 0 || samples[len(samples)-1].held != 0 {
		return 0, false
	}
	i := len(samples) - 1
	for i > 0 && samples[i-1].held == 0 {
		i--
	}
	return max(samples[i].at.Sub(ref), 0), true
}

// heldAt is the last sample taken at or before t (0 when none).
func heldAt(samples []blockSample, t time.Time) float64 {
	v := 0.0
	for _, s := range samples {
		if s.at.After(t) {
			break
		}
		v = s.held
	}
	return v
}

// last is the last sample (none: the zero sample).
func last(samples []blockSample) blockSample {
	if len(samples) == 0 {
		return blockSample{}
	}
	return samples[len(samples)-1]
}

// peak is the most blocks held by a sample.
func peak(samples []blockSample) float64 {
	m := 0.0
	for _, s := range samples {
		m = max(m, s.held)
	}
	return m
}

// runLeave is scenario 5: clients that leave right after the prefill
// answered, before the decode engine's first output, so before it read the
// KV. Two prefillers hold KV for remote decoders for lease, as vLLM does
// (VLLM_NIXL_ABORT_REQUEST_TIMEOUT); the decode engine holds every
// streamed decode leg for DecodeHold after its head, before it reads the
// KV (engine-sim's after_head_ms fault with only decode), and the leaving
// clients close their connection LeaveAfter after their request was due:
// after the prefill (a few tens of milliseconds), inside the hold. Once
// with --release-kv-on-cancel (the default), once with it off, each with
// processes of its own.
func runLeave(ctx context.Context, o Options, r *rig) ([]Line, error) {
	fmt.Fprintf(o.Out, "\n== 5. %.0f%% of clients leave right after the prefill (prefillers' --kv-lease %s) ==\n", o.LeaveShare*100, secs(o.KVLease))
	fmt.Fprintf(o.Out, "workload: chat, %d-token prompts, %d output tokens, streamed; open loop, %.0f req/s Poisson for %v; two prefillers (--enable-prefiller-sampling);\n"+
		"the decode engine holds every streamed decode leg %v after its head, before it reads the KV (fault after_head_ms, only decode);\n"+
		"every %s request's client closes its connection %v after it was due: after its prefill answered, before any output\n",
		o.LeaveTokens, o.OutputTokens, o.LeaveRate, o.LeaveDuration, o.DecodeHold, nth(o.LeaveShare), o.LeaveAfter)
	var runs []leaveRun
	for i, release := range []bool{true, false} {
		lr, err := leaveOnce(ctx, o, r, i, release)
		r.stop() // each run has processes of its own
		if err != nil {
			return nil, err
		}
		runs = append(runs, lr)
	}
	on, off := runs[0], runs[1]
	fmt.Fprintf(o.Out, "%-14s %6s %6s %8s %20s %9s %12s %12s %10s %10s\n", "release-kv", "ok", "left", "errors",
		"releases leg/failed/", "stranded", "peak held", "held at end", "gen tok", "client tok")
	for _, lr := range runs {
		fmt.Fprintf(o.Out, "%-14s %6d %6d %8d %20s %9.0f %12.0f %12.0f %10.0f %10d\n", onOff(lr.release), lr.sum.OK, lr.sum.Left,
			lr.sum.Requests-lr.sum.OK-lr.sum.Left, fmt.Sprintf("%.0f/%.0f/%.0f", lr.releases, lr.releaseFailed, lr.releaseOverLimit),
			lr.stranded(), peak(lr.samples), heldAt(lr.samples, lr.arrivalsEnd), lr.genTokens, lr.clientTokens)
	}
	for _, lr := range runs {
		fmt.Fprintf(o.Out, "sim_kv_blocks_held after the load's end, release %s: %s\n", onOff(lr.release), series(lr))
	}
	fmt.Fprintf(o.Out, "(left: clients that closed their connection, %d and %d of them after the answer's head; stranded: the prefillers' holds no decode read,\n"+
		" sim_remote_decode_prefills_total − the decode engine's sim_remote_kv_decodes_total; peak held: the most blocks held during the load;\n"+
		" the load's end: its last arrival, its last request ended %.0f and %.0f ms later; gen tok: the decode engine's vllm:generation_tokens_total;\n"+
		" client tok: the tokens the clients got; sidecar disconnects %.0f and %.0f, decode legs cancelled %.0f and %.0f, leases expired %.0f and %.0f)\n",
		on.sum.LeftAfterHead, off.sum.LeftAfterHead, msOf(on.finished.Sub(on.arrivalsEnd)), msOf(off.finished.Sub(off.arrivalsEnd)),
		on.disconnects, off.disconnects, on.cancelledDecodes, off.cancelledDecodes, on.leaseExpired, off.leaseExpired)
	return leaveLines(o, on, off), nil
}

// leaveLines are scenario 5's budget lines from the run with releases on
// and the one with them off.
func leaveLines(o Options, on, off leaveRun) []Line {
	budget := fmt.Sprintf("%.0f %% of clients leave right after the prefill: sim_kv_blocks_held back to 0 within 1 s of the load's end with release on (instead of minutes)", o.LeaveShare*100)
	after, zeroed := settled(on.samples, on.arrivalsEnd)
	onLast, offLast := last(on.samples), last(off.samples)
	back := fmt.Sprintf("still %.0f blocks held %.1f s after it", onLast.held, onLast.at.Sub(on.arrivalsEnd).Seconds())
	if zeroed {
		back = fmt.Sprintf("0 blocks %.0f ms after it", msOf(after))
	}
	// The control's last sample is taken LeaveWatch after the load's end.
	offHeld, offAfter := offLast.held, offLast.at.Sub(off.arrivalsEnd)
	// The control must strand KV: else no client left inside the window
	// and release on had nothing to do.
	lines := []Line{{Scenario: 5, Budget: budget,
		Met: zeroed && after <= time.Second && offHeld > 0 && offAfter >= o.LeaveWatch,
		Measured: fmt.Sprintf("release on: %s (%.0f held at the load's end); off: %.0f blocks still held after %.1f s (the KV of %.0f requests), kept until the %s lease",
			back, heldAt(on.samples, on.arrivalsEnd), offHeld, offAfter.Seconds(), off.stranded(), secs(o.KVLease))}}
	left := func(lr leaveRun) bool { return lr.sum.Left > 0 && lr.sum.LeftAfterHead == 0 }
	lines = append(lines, Line{Scenario: 5, Budget: "… one release per client that left (pd_sidecar_kv_releases_total{how=\"decode_leg\"}), every one in the window",
		Met: left(on) && left(off) && on.releases == float64(on.sum.Left) && on.releaseFailed+on.releaseOverLimit == 0 && on.stranded() == 0 &&
			off.releases+off.releaseFailed+off.releaseOverLimit == 0 && off.stranded() == float64(off.sum.Left),
		Measured: fmt.Sprintf("clients that left: %[4]d (%[5]d after output began); %.0[1]f decode_leg, %.0[2]f failed, %.0[3]f over_limit, holds stranded %.0[6]f; release off: clients that left %[9]d, releases %.0[7]f, holds stranded %.0[8]f",
			on.releases, on.releaseFailed, on.releaseOverLimit, on.sum.Left, on.sum.LeftAfterHead, on.stranded(),
			off.releases+off.releaseFailed+off.releaseOverLimit, off.stranded(), off.sum.Left)})
	extra := on.genTokens - float64(on.clientTokens)
	lines = append(lines, Line{Scenario: 5, Budget: "… no duplicate tokens: the decode engine's generation tokens = the clients' + at most 1 a release leg",
		Met: extra >= 0 && extra <= on.releaseLegs() && off.genTokens == float64(off.clientTokens),
		Measured: fmt.Sprintf("%.0f = %d + %.0f for %.0f release legs; release off: %.0f = %d", on.genTokens, on.clientTokens, extra, on.releaseLegs(),
			off.genTokens, off.clientTokens)})
	errs := func(lr leaveRun) int { return lr.sum.Requests - lr.sum.OK - lr.sum.Left }
	lines = append(lines, Line{Scenario: 5, Budget: "… no request fails among those that did not leave",
		Met:      errs(on) == 0 && errs(off) == 0 && on.sum.OK > 0 && off.sum.OK > 0,
		Measured: fmt.Sprintf("%d errors of %d (release on), %d of %d (off)", errs(on), on.sum.Requests-on.sum.Left, errs(off), off.sum.Requests-off.sum.Left)})
	return lines
}

// series prints the blocks held at a few points after the load's end.
func series(lr leaveRun) string {
	var parts []string
	for _, d := range []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, 750 * time.Millisecond, time.Second, 2 * time.Second} {
		t := lr.arrivalsEnd.Add(d)
		if len(lr.samples) == 0 || lr.samples[len(lr.samples)-1].at.Before(t) {
			break
		}
		parts = append(parts, fmt.Sprintf("+%v %.0f", d, heldAt(lr.samples, t)))
	}
	if after, ok := settled(lr.samples, lr.arrivalsEnd); ok {
		parts = append(parts, fmt.Sprintf("0 from +%.0f ms on", msOf(after)))
	} else if n := len(lr.samples); n > 0 {
		parts = append(parts, fmt.Sprintf("%.0f at +%.2f s, the end of the watch", lr.samples[n-1].held, lr.samples[n-1].at.Sub(lr.arrivalsEnd).Seconds()))
	}
	return strings.Join(parts, ", ")
}

// secs prints d in seconds: "480s" rather than "8m0s", as the flag is
// usually written.
func secs(d time.Duration) string { return ftoa(d.Seconds()) + "s" }

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// nth names the requests a share picks: "10th" for 0.1.
func nth(share float64) string {
	if share <= 0 {
		return "no"
	}
	n := int(1/share + 0.5)
	switch {
	case n == 1:
		return "every"
	case n%10 == 2 && n%100 != 12:
		return fmt.Sprintf("%dnd", n)
	case n%10 == 3 && n%100 != 13:
		return fmt.Sprintf("%drd", n)
	default:
		return fmt.Sprintf("%dth", n)
	}
}

// leaveOnce is one run of scenario 5: release says the sidecar's
// --release-kv-on-cancel.
func leaveOnce(ctx context.Context, o Options, r *rig, i int, release bool) (leaveRun, error) {
	lr := leaveRun{release: release}
	hold, err := json.Marshal(map[string]any{"after_head_ms": o.DecodeHold.Milliseconds(), "only": "decode"})
	if err != nil {
		return lr, fmt.Errorf("decode hold: %w", err)
	}
	var prefillers []*engine
	for _, name := range []string{"a", "b"} {
		p, err := r.engine(ctx, fmt.Sprintf("prefill-%s-%d", name, i), "prefill", "--kv-lease", o.KVLease.String())
		if err != nil {
			return lr, err
		}
		prefillers = append(prefillers, p)
	}
	d, err := r.engine(ctx, fmt.Sprintf("decode-%d", i), "decode", "--faults", string(hold))
	if err != nil {
		return lr, err
	}
	s, err := r.sidecar(ctx, "release-"+onOff(release), d, "--enable-prefiller-sampling",
		fmt.Sprintf("--release-kv-on-cancel=%t", release))
	if err != nil {
		return lr, err
	}
	reqs := workload(uint64(50+i), int(o.LeaveRate*o.LeaveDuration.Seconds()*1.5)+64, o.LeaveTokens, o.OutputTokens)
	target := loadgen.Target{Name: "release-" + onOff(release), URL: s.url(), Prefiller: prefillers[0].hostPort() + "," + prefillers[1].hostPort()}
	load := loadgen.Load{Rate: o.LeaveRate, Poisson: true, Duration: o.LeaveDuration, Rounds: 1, Timeout: 30 * time.Second,
		LeaveShare: o.LeaveShare, LeaveAfter: o.LeaveAfter}
	held := func() (float64, error) {
		var sum float64
		for _, p := range prefillers {
			v, err := metricValue(ctx, p.metrics(), "sim_kv_blocks_held")
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}
	type loadOut struct {
		res []*loadgen.TargetResults
		err error
	}
	done := make(chan loadOut, 1)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	lr.arrivalsEnd = start.Add(o.LeaveDuration)
	go func() {
		res, err := loadgen.Run(lctx, loadgen.APIChat, []loadgen.Target{target}, reqs, load, nil)
		done <- loadOut{res, err}
	}()
	// Sample the blocks held every 20 ms until the load has ended and the
	// watch is over: LeaveWatch after the load's end, or, with release
	// on, the first sample at 0 after its last request ended.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var lo loadOut
	finished := false
	watchEnd := lr.arrivalsEnd.Add(o.LeaveWatch)
	for {
		select {
		case lo = <-done:
			finished, lr.finished = true, time.Now()
		case <-tick.C:
		case <-ctx.Done():
			cancel()
			if !finished {
				<-done
			}
			return lr, ctx.Err()
		}
		v, err := held()
		if err != nil {
			cancel()
			if !finished {
				<-done
			}
			return lr, err
		}
		now := time.Now()
		lr.samples = append(lr.samples, blockSample{at: now, held: v})
		if finished && (!now.Before(watchEnd) || (release && v == 0)) {
			break
		}
	}
	if lo.err != nil {
		return lr, fmt.Errorf("load: %w", lo.err)
	}
	lr.sum = loadgen.Summarize(lo.res[0])
	for _, res := range lo.res[0].Results {
		lr.clientTokens += res.Tokens
	}
	sm, err := scrape(ctx, s.metrics())
	if err != nil {
		return lr, err
	}
	lr.releases = sm.value("pd_sidecar_kv_releases_total", "how", "decode_leg")
	lr.releaseFailed = sm.value("pd_sidecar_kv_releases_total", "how", "failed")
	lr.releaseOverLimit = sm.value("pd_sidecar_kv_releases_total", "how", "over_limit")
	lr.disconnects = sm.value("pd_sidecar_client_disconnects_total")
	dm, err := scrape(ctx, d.metrics())
	if err != nil {
		return lr, err
	}
	lr.genTokens = dm.value("vllm:generation_tokens_total")
	lr.pulls = dm.value("sim_remote_kv_decodes_total")
	lr.cancelledDecodes = dm.value("sim_requests_cancelled_total", "kind", "decode")
	for _, p := range prefillers {
		pm, err := scrape(ctx, p.metrics())
		if err != nil {
			return lr, err
		}
		lr.holds += pm.value("sim_remote_decode_prefills_total")
		lr.leaseExpired += pm.value("sim_kv_lease_expired_total")
	}
	return lr, nil
}
