package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/tailbench"
)

// runTail is `pd-bench tail`, the engine of `make bench-tail`.
func runTail(args []string) error {
	o := tailbench.DefaultOptions()
	fs := pflag.NewFlagSet("pd-bench tail", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&o.Bin, "bin", o.Bin, "directory holding engine-sim and pd-sidecar")
	fs.StringVar(&o.Dir, "dir", o.Dir, "directory for the processes' logs")
	scenarios := fs.String("scenarios", "1,2,3,4,5", "scenarios to run: 1 slow prefiller and hedging, 2 cold prefiller and pre-warm, 3 short-prompt guard, 4 prefiller killed and circuit probing, 5 clients leaving after the prefill and --release-kv-on-cancel")
	fs.DurationVar(&o.PrefillPerToken, "prefill-per-token", o.PrefillPerToken, "engines' prefill cost per token")
	fs.DurationVar(&o.DecodePerToken, "decode-per-token", o.DecodePerToken, "engines' cost per decode step")
	fs.IntVar(&o.KVBytesPerToken, "kv-bytes-per-token", o.KVBytesPerToken, "simulated KV bytes per token (a multiple of 8)")
	fs.Float64Var(&o.KVBandwidth, "kv-bandwidth", o.KVBandwidth, "bytes per second of a KV pull")
	fs.IntVar(&o.PrefillSlots, "prefill-slots", o.PrefillSlots, "prefills an engine computes at once (engine-sim --prefill-slots; 0: unbounded)")
	fs.IntVar(&o.PromptTokens, "prompt-tokens", o.PromptTokens, "scenarios 1 and 2: prompt length in tokens")
	fs.IntVar(&o.OutputTokens, "output-tokens", o.OutputTokens, "output tokens per request")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "scenario 1: open-loop Poisson arrivals per second")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "scenario 1: time each target is driven per round")
	fs.IntVar(&o.Rounds, "rounds", o.Rounds, "scenario 1: rounds (targets interleaved)")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "scenario 1: warm-up per target (not recorded)")
	fs.Float64Var(&o.SlowShare, "slow-share", o.SlowShare, "scenario 1: share of the slow prefiller's prefills slowed")
	fs.DurationVar(&o.SlowDelay, "slow-delay", o.SlowDelay, "scenario 1: delay of a slowed prefill")
	fs.StringVar(&o.HedgeAfter, "hedge-after", o.HedgeAfter, "scenario 1: the hedged sidecar's --prefill-hedge-after (a duration or auto)")
	fs.Float64Var(&o.HedgeBudget, "hedge-budget", o.HedgeBudget, "scenario 1: the hedged sidecar's --prefill-hedge-budget")
	fs.DurationVar(&o.HandshakeDelay, "handshake-delay", o.HandshakeDelay, "scenario 2: the decode engine's --kv-handshake-delay")
	fs.IntVar(&o.WarmRequests, "warm-requests", o.WarmRequests, "scenario 2: warm requests timed after the first")
	fs.IntVar(&o.ShortTokens, "short-tokens", o.ShortTokens, "scenarios 3 and 4: prompt length in tokens")
	fs.IntVar(&o.GuardTokens, "guard-tokens", o.GuardTokens, "scenario 3: --min-remote-prefill-tokens")
	fs.Float64Var(&o.ShortRate, "short-rate", o.ShortRate, "scenario 3: open-loop Poisson arrivals per second")
	fs.DurationVar(&o.ShortDuration, "short-duration", o.ShortDuration, "scenario 3: time each target is driven per round (2 rounds)")
	fs.Float64Var(&o.KillRate, "kill-rate", o.KillRate, "scenario 4: open-loop Poisson arrivals per second")
	fs.DurationVar(&o.KillBefore, "kill-before", o.KillBefore, "scenario 4: load before the kill")
	fs.DurationVar(&o.KillDown, "kill-down", o.KillDown, "scenario 4: how long the prefiller stays down")
	fs.DurationVar(&o.KillAfter, "kill-after", o.KillAfter, "scenario 4: load after the restart")
	fs.DurationVar(&o.ProbeInterval, "probe-interval", o.ProbeInterval, "scenario 4: --circuit-probe-interval measured (the control runs 0)")
	fs.IntVar(&o.LeaveTokens, "leave-tokens", o.LeaveTokens, "scenario 5: prompt length in tokens")
	fs.Float64Var(&o.LeaveRate, "leave-rate", o.LeaveRate, "scenario 5: open-loop Poisson arrivals per second")
	fs.DurationVar(&o.LeaveDuration, "leave-duration", o.LeaveDuration, "scenario 5: load time of each run (release on, release off)")
	fs.Float64Var(&o.LeaveShare, "leave-share", o.LeaveShare, "scenario 5: share of clients that leave after the prefill")
	fs.DurationVar(&o.LeaveAfter, "leave-after", o.LeaveAfter, "scenario 5: when a leaving client closes its connection, after its request was due")
	fs.DurationVar(&o.DecodeHold, "decode-hold", o.DecodeHold, "scenario 5: how long the decode engine holds a streamed decode leg before it reads the KV (longer than --leave-after)")
	fs.DurationVar(&o.KVLease, "kv-lease", o.KVLease, "scenario 5: the prefillers' --kv-lease")
	fs.DurationVar(&o.LeaveWatch, "leave-watch", o.LeaveWatch, "scenario 5: how long the prefillers' KV is watched after the load's end")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	o.Scenarios = nil
	for one := range strings.SplitSeq(*scenarios, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(one))
		if err != nil {
			return fmt.Errorf("--scenarios %q: want numbers 1..5, comma-separated: %w", *scenarios, err)
		}
		o.Scenarios = append(o.Scenarios, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return tailbench.Run(ctx, o)
}
