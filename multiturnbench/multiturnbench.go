// Package multiturnbench is `pd-bench multiturn` (make bench-multiturn):
// multi-turn KV reuse measured on loopback against a baseline of the same
// run. A chat conversation's next turn repeats the whole history; with
// bidirectional KV transfer the decode engine keeps the KV of a finished
// decode and the sidecar hands it to the next turn's prefiller, which then
// computes only the turn's new tokens.
//
// Each mode starts its own engine-sim prefiller, engine-sim decode engine
// and pd-sidecar in front of the decode engine:
//
//   - without: the sidecar and the engines without bidirectional KV
//     transfer, so every turn's prefill computes the whole prompt;
//   - with: pd-sidecar --enable-bidirectional-kv-xfer and engine-sim
//     --bidirectional-kv-xfer on both engines.
//
// Both modes drive the same conversations (same seed): C conversations of T
// turns each, streamed chat completions with a session key per
// conversation, turn k sending the history, the answer of turn k-1 exactly
// as streamed, and a new user message. The conversations run in lock-step:
// all of them send turn k at once, and only when every answer has arrived
// are the prefiller's counters scraped, so the counter's growth over the
// turn divided by C is exactly the mean prompt tokens a turn computed
// there.
package multiturnbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
	"github.com/pd-sidecar/pd-sidecar/promscrape"
)

// The modes of a run.
const (
	ModeWithout = "without"
	ModeWith    = "with"
)

// model is the model name the engines serve and the requests name.
const model = "sim-model"

// Options configure a run. DefaultOptions gives the defaults.
type Options struct {
	// Bin holds engine-sim and pd-sidecar; Dir receives the logs.
	Bin, Dir string
	// Out receives the report.
	Out io.Writer
	// Modes run, in order: ModeWithout, ModeWith or both.
	Modes []string

	// Conversations run at once, each of Turns turns; UserWords is the
	// length of each turn's new user message (words, one engine-sim token
	// each) and MaxTokens the answer's token cap, both drawn per turn from
	// Seed.
	Conversations, Turns int
	UserWords, MaxTokens loadgen.Dist
	Seed                 uint64
	// ThinkTime is the pause between two turns, after every answer of a
	// turn arrived: a user reads the answer before writing the next
	// message.
	ThinkTime time.Duration
	// Timeout bounds one turn's request.
	Timeout time.Duration

	// The engines' timing: prefill per computed prompt token, decode per
	// generated token after the first.
	PrefillPerToken, DecodePerToken time.Duration
	// PrefillerPrefixCache keeps the prefillers' prefix cache on. Off by
	// default (engine-sim --no-enable-prefix-caching, in both modes): a
	// prefill pool serving many conversations keeps none of this one's
	// history between its turns, so the baseline prefill computes what a
	// busy prefiller, or another one, would.
	PrefillerPrefixCache bool
	// Prefillers is how many prefillers a mode starts; turn k of every
	// conversation goes to prefiller (k-1) mod Prefillers. With as many
	// prefillers as turns, no prefiller ever saw the history it is given,
	// whatever its prefix cache: the isolation used where engine-sim cannot
	// turn its prefix cache off. 0 picks: one prefiller with its prefix
	// cache off where engine-sim can, else one per turn.
	Prefillers int

	// The with mode's settings: the session header, the sidecar's
	// bidirectional cache (entries, TTL) and recompute threshold, and the
	// decode engine's hold on a finished decode's KV.
	SessionHeader      string
	CacheSize          int
	CacheTTL           time.Duration
	RecomputeThreshold int
	DecoderKVTTL       time.Duration
}

// DefaultOptions is `make bench-multiturn`: under a minute of load.
func DefaultOptions() Options {
	return Options{
		Bin: "bin", Dir: "out/bench-multiturn", Out: os.Stdout, Modes: []string{ModeWithout, ModeWith},
		Conversations: 4, Turns: 9,
		UserWords: loadgen.Dist{Min: 1000, Max: 3000}, MaxTokens: loadgen.Dist{Min: 200, Max: 300},
		Seed: 1, ThinkTime: 100 * time.Millisecond, Timeout: 60 * time.Second,
		// 50 µs a prompt token: the ninth turn's history of about 20000
		// tokens prefills in about a second. 300 µs a decode step.
		PrefillPerToken: 50 * time.Microsecond, DecodePerToken: 300 * time.Microsecond,
		// 64 blocks of 16 tokens: 1024 tokens, less than one user message.
		SessionHeader: "x-session-token", CacheSize: 4096, CacheTTL: 480 * time.Second,
		RecomputeThreshold: 64, DecoderKVTTL: 480 * time.Second,
	}
}

// Validate reports the first invalid option.
func (o Options) Validate() error {
	switch {
	case o.Conversations < 1:
		return errors.New("--conversations must be at least 1")
	case o.Turns < 2:
		return errors.New("--turns must be at least 2: the first turn has no history")
	case o.UserWords.Min < 1 || o.UserWords.Max < o.UserWords.Min || o.MaxTokens.Min < 1 || o.MaxTokens.Max < o.MaxTokens.Min:
		return errors.New("--user-words and --max-tokens must be positive ranges")
	case o.PrefillPerToken < 0 || o.DecodePerToken < 0:
		return errors.New("engine timing must not be negative")
	case o.Prefillers < 0:
		return errors.New("--prefillers must not be negative")
	case o.ThinkTime < 0 || o.Timeout <= 0:
		return errors.New("--think-time must not be negative and --timeout must be positive")
	case o.SessionHeader == "":
		return errors.New("--session-header must not be empty")
	case o.CacheSize < 1 || o.CacheTTL <= 0 || o.DecoderKVTTL <= 0 || o.RecomputeThreshold < 0:
		return errors.New("the bidirectional cache size and TTLs must be positive, the threshold not negative")
	case len(o.Modes) == 0:
		return errors.New("--modes: at least one of without, with")
	}
	for i, m := range o.Modes {
		if m != ModeWithout && m != ModeWith {
			return fmt.Errorf("--modes: %q is neither without nor with", m)
		}
		if slices.Contains(o.Modes[:i], m) {
			return fmt.Errorf("--modes: %q twice", m)
		}
	}
	return nil
}

// The flags a build must list for the with mode and for the prefiller's
// small prefix cache.
const (
	sidecarBidirectionalFlag = "enable-bidirectional-kv-xfer"
	engineBidirectionalFlag  = "bidirectional-kv-xfer"
	enginePrefixCacheFlag    = "no-enable-prefix-caching"
	// sidecarSideChannelFlag names the decode engine's side-channel port,
	// which a build that lists it checks a history's port against.
	sidecarSideChannelFlag = "decode-side-channel-port"
)

// Run runs the modes and prints the per-turn table and the budget lines.
// It returns an error when a mode could not be run; budget lines that
// fail are reported, not returned.
func Run(ctx context.Context, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	o.Dir = dir
	engineFlags, err := helpFlags(ctx, filepath.Join(o.Bin, "engine-sim"))
	if err != nil {
		return err
	}
	sidecarFlags, err := helpFlags(ctx, filepath.Join(o.Bin, "pd-sidecar"))
	if err != nil {
		return err
	}
	if slices.Contains(o.Modes, ModeWith) {
		var missing []string
		if !sidecarFlags[sidecarBidirectionalFlag] {
			missing = append(missing, "pd-sidecar --"+sidecarBidirectionalFlag)
		}
		if !engineFlags[engineBidirectionalFlag] {
			missing = append(missing, "engine-sim --"+engineBidirectionalFlag)
		}
		if len(missing) > 0 {
			return fmt.Errorf("the with mode needs %v, which the binaries in %s do not list: build them from a tree that has them, or run --modes without", missing, o.Bin)
		}
	}
	prefixCache := !o.PrefillerPrefixCache && engineFlags[enginePrefixCacheFlag]
	if o.Prefillers == 0 {
		o.Prefillers = 1
		if !prefixCache {
			o.Prefillers = o.Turns
		}
	}

	fmt.Fprintf(o.Out, "pd-bench multiturn: %d conversations × %d turns in lock-step, streamed chat; new user message %s words a turn, max_tokens %s, seed %d\n",
		o.Conversations, o.Turns, o.UserWords, o.MaxTokens, o.Seed)
	fmt.Fprintf(o.Out, "engine-sim: %d prefiller(s), one decode engine, %v prefill a computed prompt token, %v a decode step; pd-sidecar in front of the decode engine; logs in %s\n",
		o.Prefillers, o.PrefillPerToken, o.DecodePerToken, o.Dir)
	switch {
	case prefixCache:
		fmt.Fprintf(o.Out, "prefillers: --%s in both modes: no prefix cache keeps a history between turns\n", enginePrefixCacheFlag)
	case o.Prefillers >= o.Turns:
		fmt.Fprintf(o.Out, "prefillers: turn k goes to prefiller k, which never saw the conversation: its prefix cache holds no history (engine-sim has no --%s)\n",
			enginePrefixCacheFlag)
	default:
		fmt.Fprintf(o.Out, "NOTE: %d prefiller(s) for %d turns with engine-sim's default prefix cache: a prefiller that served an earlier turn keeps that history, and the without mode's prefills hit it\n",
			o.Prefillers, o.Turns)
	}
	var results []*modeResult
	for _, mode := range o.Modes {
		mr, err := runMode(ctx, o, mode, prefixCache, sidecarFlags)
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
		results = append(results, mr)
	}
	rep := buildReport(o, results)
	return rep.write(o.Out)
}

// modeResult is what one mode measured.
type modeResult struct {
	mode string
	// turns[k] is turn k+1 over every conversation.
	turns []turnData
	// answers[c][k] is conversation c's answer of turn k+1.
	answers [][]string
	// computedFromCache: the engines export no sim_prefill_computed_tokens_total,
	// so computed tokens are the prefix cache's queries less its hits.
	computedFromCache bool
	// usageMismatches counts answers whose usage.prompt_tokens differs from
	// PromptTokens (the local count of engine-sim's tokens).
	usageMismatches int
	// The counters' growth over the conversations (the warm-up excluded).
	uses, reused              float64
	misses                    map[string]float64
	pulls, blocksPulled, pins float64
	// sidecarMetricsSeen: the sidecar exports the multiturn counters.
	sidecarMetricsSeen bool
}

// turnData is one turn over every conversation: each conversation's new
// tokens and TTFT, and the counters' growth over the turn.
type turnData struct {
	newTokens []int
	ttft      []time.Duration
	// computed is the prefiller's computed prompt tokens, decoderComputed
	// the decode engine's (prefills it ran itself: fallbacks).
	computed, decoderComputed float64
	uses, misses              float64
}

// counters is one scrape of the three processes.
type counters struct {
	computed, decoderComputed float64
	fromCache                 bool
	uses, reused, missTotal   float64
	misses                    map[string]float64
	pulls, blocksPulled, pins float64
	sidecarSeen               bool
}

// computedTokens is the prompt tokens an engine computed: engine-sim's
// sim_prefill_computed_tokens_total, or where it has none its prefix
// cache's queries less hits (the same count while no history is pulled).
func computedTokens(m promscrape.Metrics) (float64, bool) {
	if _, ok := m["sim_prefill_computed_tokens_total"]; ok {
		return m.Value("sim_prefill_computed_tokens_total", nil), false
	}
	return m.Value("vllm:prefix_cache_queries_total", nil) - m.Value("vllm:prefix_cache_hits_total", nil), true
}

// readCounters scrapes the prefillers (summed), the decode engine and the
// sidecar.
func readCounters(ctx context.Context, prefillers []endpoint, decode, side endpoint) (counters, error) {
	var c counters
	for _, p := range prefillers {
		pm, err := scrape(ctx, p.metrics())
		if err != nil {
			return c, err
		}
		computed, fromCache := computedTokens(pm)
		c.computed += computed
		c.fromCache = c.fromCache || fromCache
		c.pulls += pm.Value("sim_bidirectional_history_pulls_total", nil)
		c.blocksPulled += pm.Value("sim_bidirectional_history_blocks_pulled_total", nil)
	}
	dm, err := scrape(ctx, decode.metrics())
	if err != nil {
		return c, err
	}
	sm, err := scrape(ctx, side.metrics())
	if err != nil {
		return c, err
	}
	var fromCacheD bool
	c.decoderComputed, fromCacheD = computedTokens(dm)
	c.fromCache = c.fromCache || fromCacheD
	c.pins = dm.Value("sim_bidirectional_pins_total", nil)
	c.uses = sm.Value("pd_sidecar_multiturn_uses_total", nil)
	c.reused = sm.Value("pd_sidecar_multiturn_tokens_reused_total", nil)
	c.misses = byLabel(sm, "pd_sidecar_multiturn_misses_total", "reason")
	c.missTotal = sm.Value("pd_sidecar_multiturn_misses_total", nil)
	_, c.sidecarSeen = sm["pd_sidecar_multiturn_uses_total"]
	return c, nil
}

// runMode starts one mode's processes, drives the conversations and
// stops the processes; sidecarFlags are the flags the pd-sidecar binary
// lists.
func runMode(ctx context.Context, o Options, mode string, prefixCache bool, sidecarFlags flagSet) (*modeResult, error) {
	r := &rig{bin: o.Bin, dir: filepath.Join(o.Dir, mode)}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, fmt.Errorf("--dir: %w", err)
	}
	defer r.stop()
	timing := []string{
		"--prefill-us-per-token", ftoa(float64(o.PrefillPerToken) / float64(time.Microsecond)),
		"--decode-us-per-token", ftoa(float64(o.DecodePerToken) / float64(time.Microsecond)),
	}
	var bidi, sidecarArgs []string
	if mode == ModeWith {
		bidi = []string{"--bidirectional-kv-xfer", "--decoder-kv-blocks-ttl", o.DecoderKVTTL.String(),
			"--kv-recompute-threshold", itoa(o.RecomputeThreshold)}
		sidecarArgs = []string{"--enable-bidirectional-kv-xfer", "--bidirectional-cache-size", itoa(o.CacheSize),
			"--bidirectional-cache-ttl", o.CacheTTL.String(), "--bidirectional-session-header", o.SessionHeader,
			"--bidirectional-recompute-threshold", itoa(o.RecomputeThreshold)}
	}
	prefillArgs := append(slices.Clone(timing), bidi...)
	if prefixCache {
		prefillArgs = append(prefillArgs, "--"+enginePrefixCacheFlag)
	}
	prefillers := make([]endpoint, o.Prefillers)
	for i := range prefillers {
		label := "e-prefill"
		if o.Prefillers > 1 {
			label = fmt.Sprintf("e-prefill-%d", i+1)
		}
		p, err := r.engine(ctx, label, "prefill", prefillArgs...)
		if err != nil {
			return nil, err
		}
		prefillers[i] = p
	}
	decode, err := r.engine(ctx, "e-decode", "decode", append(slices.Clone(timing), bidi...)...)
	if err != nil {
		return nil, err
	}
	if mode == ModeWith && sidecarFlags[sidecarSideChannelFlag] {
		// The decode engine's side channel, on this machine's loopback
		// address, which is the sidecar's pod address here (--host). A
		// build without the flag checks no port and takes loopback.
		sidecarArgs = append(sidecarArgs, "--host", "127.0.0.1", "--decode-side-channel-port", itoa(decode.kvPort))
	}
	side, err := r.sidecar(ctx, "s-sidecar", decode, append([]string{"--kv-connector", "nixlv2"}, sidecarArgs...)...)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Out, "\n== mode %s: decode engine %s, sidecar %s ==\n", mode, decode.hostPort(), side.hostPort())

	client := newChatClient(side.url(), o.Timeout, nil)
	defer client.close()
	// A warm-up turn of a session of its own through every prefiller
	// opens the connections, so that the first measured turn pays no more
	// than the others.
	for i, p := range prefillers {
		if err := warmUp(ctx, client, map[string]string{o.SessionHeader: fmt.Sprintf("warm-up-%s-%d", mode, i), prefillerHeader: p.hostPort()}); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}

	convs := make([]*Conversation, o.Conversations)
	for i := range convs {
		convs[i] = NewConversation(o.Seed, i, o.Turns, o.UserWords, o.MaxTokens)
	}
	mr := &modeResult{mode: mode, answers: make([][]string, len(convs))}
	prev := make([]int, len(convs)) // each conversation's previous prompt tokens
	start, err := readCounters(ctx, prefillers, decode, side)
	if err != nil {
		return nil, err
	}
	before := start
	began := time.Now()
	for turn := 1; turn <= o.Turns; turn++ {
		if turn > 1 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(o.ThinkTime):
			}
		}
		prefiller := prefillers[(turn-1)%len(prefillers)].hostPort()
		td := turnData{newTokens: make([]int, len(convs)), ttft: make([]time.Duration, len(convs))}
		var wg sync.WaitGroup
		errs := make([]error, len(convs))
		mismatch := make([]bool, len(convs))
		for i, c := range convs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msgs, maxTokens, err := c.Next()
				if err != nil {
					errs[i] = err
					return
				}
				body, err := chatBody(model, msgs, maxTokens)
				if err != nil {
					errs[i] = err
					return
				}
				res, err := client.send(ctx, body, map[string]string{o.SessionHeader: c.ID, prefillerHeader: prefiller})
				if err != nil {
					errs[i] = fmt.Errorf("%s turn %d: %w", c.ID, turn, err)
					return
				}
				if err := c.Answer(res.Content); err != nil {
					errs[i] = err
					return
				}
				// New tokens are what the prompt adds to the previous turn's:
				// the answer carried back, the new user message and their
				// template tokens. The engine's count is used; the bench's own
				// stands in where the stream reported no usage.
				pt := PromptTokens(msgs)
				if res.PromptTokens > 0 {
					mismatch[i] = res.PromptTokens != pt
					pt = res.PromptTokens
				}
				td.newTokens[i] = pt - prev[i]
				prev[i] = pt
				td.ttft[i] = res.TTFT
				mr.answers[i] = append(mr.answers[i], res.Content)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				return nil, err
			}
			if mismatch[i] {
				mr.usageMismatches++
			}
		}
		after, err := readCounters(ctx, prefillers, decode, side)
		if err != nil {
			return nil, err
		}
		td.computed = after.computed - before.computed
		td.decoderComputed = after.decoderComputed - before.decoderComputed
		td.uses = after.uses - before.uses
		td.misses = after.missTotal - before.missTotal
		mr.turns = append(mr.turns, td)
		mr.computedFromCache = mr.computedFromCache || after.fromCache
		fmt.Fprintf(o.Out, "  turn %d/%d done (%.1f s)\n", turn, o.Turns, time.Since(began).Seconds())
		before = after
	}
	mr.uses, mr.reused = before.uses-start.uses, before.reused-start.reused
	mr.misses = map[string]float64{}
	for k, v := range before.misses {
		if d := v - start.misses[k]; d != 0 {
			mr.misses[k] = d
		}
	}
	mr.pulls, mr.blocksPulled, mr.pins = before.pulls-start.pulls, before.blocksPulled-start.blocksPulled, before.pins-start.pins
	mr.sidecarMetricsSeen = before.sidecarSeen
	return mr, nil
}

// prefillerHeader names the prefiller of a request to the sidecar.
const prefillerHeader = "x-prefiller-host-port"

// warmUp sends one short turn with headers.
func warmUp(ctx context.Context, c *chatClient, headers map[string]string) error {
	body, err := chatBody(model, []Message{{Role: "user", Content: "warm up the connections of this bench before its turns are timed"}}, 4)
	if err != nil {
		return err
	}
	_, err = c.send(ctx, body, headers)
	return err
}
