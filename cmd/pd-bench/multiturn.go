package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
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
	modes := fs.String("modes", strings.Join(o.Modes, ","), "modes to run, comma-separated, in order: without (no bidirectional KV transfer), with-<conversation|pod|none>[@TTL] (sidecar --enable-bidirectional-kv-xfer, engines --bidirectional-kv-xfer; the session token as --session-token describes; @TTL: the decode engine's --decoder-kv-blocks-ttl for this mode)")
	tokens := fs.String("session-token", "", "how the with modes' conversations name themselves, comma-separated, replacing the with modes of --modes by with-<each>: conversation (one --session-header key a conversation), pod (every conversation the same key, base64 of --pod as llm-d's endpoint picker sets it), none (no header)")
	fs.IntVar(&o.Conversations, "conversations", o.Conversations, "conversations run at once (in lock-step, turn by turn)")
	fs.IntVar(&o.Turns, "turns", o.Turns, "turns of each conversation")
	userWords := fs.String("user-words", o.UserWords.String(), "words of each turn's new user message: N or A-B (uniform, drawn per turn)")
	maxTokens := fs.String("max-tokens", o.MaxTokens.String(), "max_tokens of each turn: N or A-B (uniform, drawn per turn)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the conversations (the same in every mode)")
	fs.Float64Var(&o.Abandon, "abandon", o.Abandon, "share of the conversations, drawn from --seed, that stop after their first turn (their pinned history is never read)")
	fs.DurationVar(&o.ThinkTime, "think-time", o.ThinkTime, "pause between two turns, after every answer arrived")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "bound of one turn's request")
	fs.DurationVar(&o.PrefillPerToken, "prefill-per-token", o.PrefillPerToken, "engines' prefill cost per computed prompt token")
	fs.DurationVar(&o.DecodePerToken, "decode-per-token", o.DecodePerToken, "engines' cost per decode step")
	fs.IntVar(&o.BlockSize, "block-size", o.BlockSize, "engines' --block-size (tokens a KV block)")
	fs.IntVar(&o.KVBlocks, "kv-blocks", o.KVBlocks, "engines' --num-kv-blocks (the decode engine's pins use them)")
	fs.BoolVar(&o.PrefillerPrefixCache, "prefiller-prefix-cache", o.PrefillerPrefixCache, "keep the prefillers' prefix cache on (off by default, engine-sim --no-enable-prefix-caching in both modes: no prefiller keeps a conversation's history between its turns)")
	fs.IntVar(&o.Prefillers, "prefillers", o.Prefillers, "prefillers a mode starts, turn k going to prefiller (k-1) mod N (0: one, its prefix cache off; one a turn where engine-sim cannot turn it off, so that no prefiller holds the history it is given)")
	fs.StringVar(&o.SessionHeader, "session-header", o.SessionHeader, "header carrying the session token (the sidecar's --bidirectional-session-header)")
	fs.StringVar(&o.PodName, "pod", o.PodName, "namespace/name of the decode pod whose token the pod mode sends")
	fs.IntVar(&o.CacheSize, "bidirectional-cache-size", o.CacheSize, "with modes: the sidecar's --bidirectional-cache-size")
	fs.DurationVar(&o.CacheTTL, "bidirectional-cache-ttl", o.CacheTTL, "with modes: the sidecar's --bidirectional-cache-ttl (0: the mode's decoder TTL)")
	fs.IntVar(&o.RecomputeThreshold, "recompute-threshold", o.RecomputeThreshold, "with modes: the sidecar's --bidirectional-recompute-threshold and the engines' --kv-recompute-threshold")
	fs.DurationVar(&o.DecoderKVTTL, "decoder-kv-blocks-ttl", o.DecoderKVTTL, "with modes without @TTL: the engines' --decoder-kv-blocks-ttl, matched by the sidecar's --bidirectional-cache-ttl")
	fs.DurationVar(&o.SampleEvery, "sample-every", o.SampleEvery, "interval at which the decode engine's held blocks and the sidecar's pinned-tokens estimate are sampled")
	fs.DurationVar(&o.Tail, "tail", o.Tail, "bound of the sampling after the last answer: it stops once no block is held, or after --tail or the mode's TTL and a second, whichever is shorter")
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
	o.Modes = splitList(*modes)
	if fs.Changed("session-token") {
		if fs.Changed("modes") && slices.ContainsFunc(o.Modes, func(m string) bool { return m != multiturnbench.ModeWithout }) {
			return errors.New("--session-token replaces the with modes of --modes: give one or the other")
		}
		kept := slices.DeleteFunc(o.Modes, func(m string) bool { return m != multiturnbench.ModeWithout })
		for _, t := range splitList(*tokens) {
			kept = append(kept, "with-"+t)
		}
		o.Modes = kept
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return multiturnbench.Run(ctx, o)
}

// splitList is a comma-separated list's non-empty items.
func splitList(s string) []string {
	var out []string
	for m := range strings.SplitSeq(s, ",") {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	return out
}
