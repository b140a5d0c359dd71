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
//   - with-<token>[@TTL]: pd-sidecar --enable-bidirectional-kv-xfer and
//     engine-sim --bidirectional-kv-xfer on both engines, the decode
//     engine pinning a finished answer for TTL; the conversations name
//     themselves by the session header as token says: conversation (one
//     key each), pod (the one value llm-d's endpoint picker sets for the
//     decode pod, on every conversation) or none (no header).
//
// Every mode drives the same conversations (same seed): C conversations of
// T turns each (a drawn share of them stop after turn 1), streamed chat
// completions, turn k sending the history, the answer of turn k-1 exactly
// as streamed, and a new user message. The conversations run in lock-step:
// all of them send turn k at once. Each turn carries an X-Request-Id of
// its own, and engine-sim's ledger (GET /sim/computed) gives, by that id,
// the prompt tokens every engine computed for it, the history the
// prefiller pulled and the blocks the decode engine pinned: the criteria
// are judged turn by turn and conversation by conversation. Meanwhile the
// decode engine's held blocks are sampled, through the run and after it,
// to price the pinned histories, read or not.
package multiturnbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// model is the model name the engines serve and the requests name.
const model = "sim-model"

// Options configure a run. DefaultOptions gives the defaults.
type Options struct {
	// Bin holds engine-sim and pd-sidecar; Dir receives the logs.
	Bin, Dir string
	// Out receives the report.
	Out io.Writer
	// Modes run, in order: ModeWithout and with modes,
	// with-<conversation|pod|none>[@<decoder TTL>] (see parseMode).
	Modes []string

	// Conversations run at once, each of Turns turns; UserWords is the
	// length of each turn's new user message (words, one engine-sim token
	// each) and MaxTokens the answer's token cap, both drawn per turn from
	// Seed.
	Conversations, Turns int
	UserWords, MaxTokens loadgen.Dist
	Seed                 uint64
	// Abandon is the share of conversations, drawn from Seed, that stop
	// after their first turn: their pinned history is never read.
	Abandon float64
	// ThinkTime is the pause between two turns, after every answer of a
	// turn arrived: a user reads the answer before writing the next
	// message.
	ThinkTime time.Duration
	// Timeout bounds one turn's request.
	Timeout time.Duration

	// The engines' timing: prefill per computed prompt token, decode per
	// generated token after the first.
	PrefillPerToken, DecodePerToken time.Duration
	// BlockSize and KVBlocks are the engines' --block-size and
	// --num-kv-blocks: the decode engine's pins compete for the blocks.
	BlockSize, KVBlocks int
	// PrefillerPrefixCache keeps the prefillers' prefix cache on. Off by
	// default (engine-sim --no-enable-prefix-caching, in every mode): a
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

	// The with modes' settings: the session header and the pod whose
	// token the pod mode sends (namespace/name), the sidecar's
	// bidirectional cache (entries; TTL, 0: the mode's decoder TTL) and
	// recompute threshold, and the decode engine's hold on a finished
	// decode's KV (a mode's @TTL overrides it).
	SessionHeader      string
	PodName            string
	CacheSize          int
	CacheTTL           time.Duration
	RecomputeThreshold int
	DecoderKVTTL       time.Duration

	// SampleEvery is the interval at which the decode engine's held
	// blocks (and the sidecar's estimate) are sampled, from the first turn
	// to the end of the tail. Tail bounds the sampling after the last
	// answer: it stops once the decode engine holds no block, or after
	// Tail or the mode's decoder TTL and a second, whichever is shorter.
	SampleEvery, Tail time.Duration
}

// DefaultOptions is `make bench-multiturn`: about 80 seconds on 2 cores.
func DefaultOptions() Options {
	return Options{
		Bin: "bin", Dir: "out/bench-multiturn", Out: os.Stdout,
		Modes:         []string{ModeWithout, withPrefix + TokenConversation, withPrefix + TokenPod, withPrefix + TokenConversation + "@15s"},
		Conversations: 32, Turns: 6,
		UserWords: loadgen.Dist{Min: 300, Max: 900}, MaxTokens: loadgen.Dist{Min: 100, Max: 200},
		Seed: 1, Abandon: 0.3, ThinkTime: 200 * time.Millisecond, Timeout: 60 * time.Second,
		// 200 µs a prompt token: the sixth turn's history of about 5000
		// tokens prefills in about a second. 300 µs a decode step.
		PrefillPerToken: 200 * time.Microsecond, DecodePerToken: 300 * time.Microsecond,
		// 65536 blocks of 16 tokens: room for every pin of the pod mode,
		// which keeps all of them to their TTL.
		BlockSize: 16, KVBlocks: 65536,
		SessionHeader: "x-session-token", PodName: "llm-d/ms-sim-llm-d-decode-0", CacheSize: 4096,
		// 64 tokens: less than one user message.
		RecomputeThreshold: 64, DecoderKVTTL: 480 * time.Second,
		SampleEvery: 100 * time.Millisecond, Tail: 20 * time.Second,
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
	case o.Abandon < 0 || o.Abandon >= 1:
		return errors.New("--abandon must be at least 0 and less than 1")
	case o.PrefillPerToken < 0 || o.DecodePerToken < 0:
		return errors.New("engine timing must not be negative")
	case o.BlockSize < 1 || o.KVBlocks < 1:
		return errors.New("--block-size and --kv-blocks must be positive")
	case o.Prefillers < 0:
		return errors.New("--prefillers must not be negative")
	case o.ThinkTime < 0 || o.Timeout <= 0:
		return errors.New("--think-time must not be negative and --timeout must be positive")
	case o.SessionHeader == "":
		return errors.New("--session-header must not be empty")
	case !strings.Contains(o.PodName, "/"):
		return errors.New("--pod must be namespace/name")
	case o.CacheSize < 1 || o.CacheTTL < 0 || o.DecoderKVTTL <= 0 || o.RecomputeThreshold < 0:
		return errors.New("the bidirectional cache size and decoder TTL must be positive, the cache TTL and threshold not negative")
	case o.SampleEvery <= 0 || o.Tail < 0:
		return errors.New("--sample-every must be positive and --tail not negative")
	case len(o.Modes) == 0:
		return errors.New("--modes: at least one of without, with-conversation, with-pod, with-none")
	}
	_, err := o.modes()
	return err
}

// modes parses Options.Modes.
func (o Options) modes() ([]mode, error) {
	var out []mode
	for _, s := range o.Modes {
		m, err := parseMode(s, o.DecoderKVTTL)
		if err != nil {
			return nil, err
		}
		for _, seen := range out {
			if seen.name == m.name {
				return nil, fmt.Errorf("--modes: %q twice", m.name)
			}
		}
		out = append(out, m)
	}
	return out, nil
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

// Run runs the modes and prints the per-turn tables, the pinned KV and
// the criteria. It returns an error when a mode could not be run;
// criteria that fail are reported, not returned.
func Run(ctx context.Context, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	modes, err := o.modes()
	if err != nil {
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
	if slices.ContainsFunc(modes, mode.with) {
		var missing []string
		if !sidecarFlags[sidecarBidirectionalFlag] {
			missing = append(missing, "pd-sidecar --"+sidecarBidirectionalFlag)
		}
		if !engineFlags[engineBidirectionalFlag] {
			missing = append(missing, "engine-sim --"+engineBidirectionalFlag)
		}
		if len(missing) > 0 {
			return fmt.Errorf("the with modes need %v, which the binaries in %s do not list: build them from a tree that has them, or run --modes without", missing, o.Bin)
		}
	}
	prefixCache := !o.PrefillerPrefixCache && engineFlags[enginePrefixCacheFlag]
	if o.Prefillers == 0 {
		o.Prefillers = 1
		if !prefixCache {
			o.Prefillers = o.Turns
		}
	}
	abandoned := abandonedSet(o.Seed, o.Conversations, o.Abandon)

	fmt.Fprintf(o.Out, "pd-bench multiturn: %d conversations × %d turns in lock-step, streamed chat; new user message %s words a turn, max_tokens %s, seed %d; %d conversations (--abandon %.2f) stop after turn 1\n",
		o.Conversations, o.Turns, o.UserWords, o.MaxTokens, o.Seed, countTrue(abandoned), o.Abandon)
	fmt.Fprintf(o.Out, "engine-sim: %d prefiller(s), one decode engine, %v prefill a computed prompt token, %v a decode step, %d KV blocks of %d tokens; pd-sidecar in front of the decode engine; logs in %s\n",
		o.Prefillers, o.PrefillPerToken, o.DecodePerToken, o.KVBlocks, o.BlockSize, o.Dir)
	switch {
	case prefixCache:
		fmt.Fprintf(o.Out, "prefillers: --%s in every mode: no prefix cache keeps a history between turns\n", enginePrefixCacheFlag)
	case o.Prefillers >= o.Turns:
		fmt.Fprintf(o.Out, "prefillers: turn k goes to prefiller k, which never saw the conversation: its prefix cache holds no history (engine-sim has no --%s)\n",
			enginePrefixCacheFlag)
	default:
		fmt.Fprintf(o.Out, "NOTE: %d prefiller(s) for %d turns with engine-sim's default prefix cache: a prefiller that served an earlier turn keeps that history, and the without mode's prefills hit it\n",
			o.Prefillers, o.Turns)
	}
	var results []*modeResult
	for _, m := range modes {
		mr, err := runMode(ctx, o, m, abandoned, prefixCache, sidecarFlags)
		if err != nil {
			return fmt.Errorf("mode %s: %w", m.name, err)
		}
		results = append(results, mr)
	}
	return buildReport(o, results).write(o.Out)
}

// abandonedSet draws the conversations that stop after their first turn:
// round(share × n) of them, from seed alone, so every mode abandons the
// same ones.
func abandonedSet(seed uint64, n int, share float64) []bool {
	out := make([]bool, n)
	r := rand.New(rand.NewPCG(seed, 0xab4d0))
	for _, i := range r.Perm(n)[:int(math.Round(share*float64(n)))] {
		out[i] = true
	}
	return out
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
