package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
	"github.com/pd-sidecar/pd-sidecar/multiturnbench"
)

// runMultiturn is `pd-bench multiturn`, the engine of `make bench-multiturn`.
func runMultiturn(args []string) error {
	o := multiturnbench.DefaultOptions()
	fs := pflag.NewFlagSet("pd-bench multiturn", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&o.Bin, "bin", o.Bin, "directory holding engine-sim and pd-sidecar")
	fs.StringVar(&o.Dir, "dir", o.Dir, "directory for the processes' logs (one folder a mode)")
	modes := fs.String("modes", strings.Join(o.Modes, ","), "modes to run, comma-separated: without (no bidirectional KV transfer), with (sidecar --enable-bidirectional-kv-xfer, engines --bidirectional-kv-xfer)")
	fs.IntVar(&o.Conversations, "conversations", o.Conversations, "conversations run at once (in lock-step, turn by turn)")
	fs.IntVar(&o.Turns, "turns", o.Turns, "turns of each conversation")
	userWords := fs.String("user-words", o.UserWords.String(), "words of each turn's new user message: N or A-B (uniform, drawn per turn)")
	maxTokens := fs.String("max-tokens", o.MaxTokens.String(), "max_tokens of each turn: N or A-B (uniform, drawn per turn)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the conversations (the same in every mode)")
	fs.DurationVar(&o.ThinkTime, "think-time", o.ThinkTime, "pause between two turns, after every answer arrived")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "bound of one turn's request")
	fs.DurationVar(&o.PrefillPerToken, "prefill-per-token", o.PrefillPerToken, "engines' prefill cost per computed prompt token")
	fs.DurationVar(&o.DecodePerToken, "decode-per-token", o.DecodePerToken, "engines' cost per decode step")
	fs.BoolVar(&o.PrefillerPrefixCache, "prefiller-prefix-cache", o.PrefillerPrefixCache, "keep the prefillers' prefix cache on (off by default, engine-sim --no-enable-prefix-caching in both modes: no prefiller keeps a conversation's history between its turns)")
	fs.IntVar(&o.Prefillers, "prefillers", o.Prefillers, "prefillers a mode starts, turn k going to prefiller (k-1) mod N (0: one, its prefix cache off; one a turn where engine-sim cannot turn it off, so that no prefiller holds the history it is given)")
	fs.StringVar(&o.SessionHeader, "session-header", o.SessionHeader, "header carrying each conversation's session key (the sidecar's --bidirectional-session-header)")
	fs.IntVar(&o.CacheSize, "bidirectional-cache-size", o.CacheSize, "with mode: the sidecar's --bidirectional-cache-size")
	fs.DurationVar(&o.CacheTTL, "bidirectional-cache-ttl", o.CacheTTL, "with mode: the sidecar's --bidirectional-cache-ttl")
	fs.IntVar(&o.RecomputeThreshold, "recompute-threshold", o.RecomputeThreshold, "with mode: the sidecar's --bidirectional-recompute-threshold and the engines' --kv-recompute-threshold")
	fs.DurationVar(&o.DecoderKVTTL, "decoder-kv-blocks-ttl", o.DecoderKVTTL, "with mode: the engines' --decoder-kv-blocks-ttl")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	var err error
	if o.UserWords, err = loadgen.ParseDist(*userWords); err != nil {
		return fmt.Errorf("--user-words: %w", err)
	}
	if o.MaxTokens, err = loadgen.ParseDist(*maxTokens); err != nil {
		return fmt.Errorf("--max-tokens: %w", err)
	}
	o.Modes = nil
	for m := range strings.SplitSeq(*modes, ",") {
		if m = strings.TrimSpace(m); m != "" {
			o.Modes = append(o.Modes, m)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return multiturnbench.Run(ctx, o)
}
