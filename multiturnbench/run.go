package multiturnbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// modeResult is what one mode measured.
type modeResult struct {
	mode mode
	// turns[c][k] is conversation c's turn k+1 (an abandoned conversation
	// has one).
	turns [][]*turnRec
	// abandoned[c]: conversation c stopped after its first turn.
	abandoned []bool
	// ledger: the engines export GET /sim/computed.
	ledger bool
	// usageMismatches counts answers whose usage.prompt_tokens differs from
	// PromptTokens (the local count of engine-sim's tokens).
	usageMismatches int
	// perTurn[k] is the sidecar's counters' growth over turn k+1.
	perTurn []turnCounters
	// The counters' growth over the conversations (the warm-up excluded).
	uses, reused              float64
	misses                    map[string]float64
	pulls, blocksPulled, pins float64
	// sidecarMetricsSeen: the sidecar exports the multiturn counters.
	sidecarMetricsSeen bool
	// pinned is the sampled pinned KV.
	pinned pinnedSeries
}

// turnRec is one turn of one conversation.
type turnRec struct {
	id string
	// promptTokens and completionTokens are the usage the engine reported
	// (promptTokens: the bench's count where it reported none).
	promptTokens, completionTokens int
	// newTokens is what the prompt adds to the previous turn's sequence as
	// the engine counted it: prompt tokens less the previous turn's prompt
	// and output tokens (the whole prompt on turn 1).
	newTokens int
	ttft      time.Duration
	// sent and ended are since the mode's first turn.
	sent, ended time.Duration
	// From the engines' ledgers: the prompt tokens computed for the turn on
	// every engine (measured: some engine recorded the request), the
	// history the prefiller pulled and the sequence the decode engine
	// pinned.
	measured                   bool
	computed, history          int
	pinnedBlocks, pinnedTokens int
	answer                     string
	// usageMismatch: the engine's prompt_tokens differ from the bench's
	// count of engine-sim's tokens.
	usageMismatch bool
}

// turnCounters is the sidecar's multiturn counters' growth over a turn.
type turnCounters struct{ uses, misses float64 }

// counters is one scrape of the prefillers, the decode engine and the
// sidecar.
type counters struct {
	uses, reused, missTotal   float64
	misses                    map[string]float64
	pulls, blocksPulled, pins float64
	sidecarSeen               bool
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
	c.pins = dm.Value("sim_bidirectional_pins_total", nil)
	c.uses = sm.Value("pd_sidecar_multiturn_uses_total", nil)
	c.reused = sm.Value("pd_sidecar_multiturn_tokens_reused_total", nil)
	c.misses = byLabel(sm, "pd_sidecar_multiturn_misses_total", "reason")
	c.missTotal = sm.Value("pd_sidecar_multiturn_misses_total", nil)
	_, c.sidecarSeen = sm["pd_sidecar_multiturn_uses_total"]
	return c, nil
}

// modeEnv is one mode's running processes.
type modeEnv struct {
	prefillers   []endpoint
	decode, side endpoint
}

// startMode starts a mode's engines and sidecar on r.
func startMode(ctx context.Context, r *rig, o Options, m mode, prefixCache bool, sidecarFlags flagSet) (modeEnv, error) {
	var env modeEnv
	engineArgs := []string{
		"--prefill-us-per-token", ftoa(float64(o.PrefillPerToken) / float64(time.Microsecond)),
		"--decode-us-per-token", ftoa(float64(o.DecodePerToken) / float64(time.Microsecond)),
		"--block-size", itoa(o.BlockSize), "--num-kv-blocks", itoa(o.KVBlocks),
	}
	var sidecarArgs []string
	if m.with() {
		cacheTTL := m.ttl
		if o.CacheTTL > 0 {
			cacheTTL = o.CacheTTL
		}
		engineArgs = append(engineArgs, "--bidirectional-kv-xfer", "--decoder-kv-blocks-ttl", m.ttl.String(),
			"--kv-recompute-threshold", itoa(o.RecomputeThreshold))
		sidecarArgs = []string{"--enable-bidirectional-kv-xfer", "--bidirectional-cache-size", itoa(o.CacheSize),
			"--bidirectional-cache-ttl", cacheTTL.String(), "--bidirectional-session-header", o.SessionHeader,
			"--bidirectional-recompute-threshold", itoa(o.RecomputeThreshold)}
	}
	prefillArgs := slices.Clone(engineArgs)
	if prefixCache {
		prefillArgs = append(prefillArgs, "--"+enginePrefixCacheFlag)
	}
	env.prefillers = make([]endpoint, o.Prefillers)
	for i := range env.prefillers {
		label := "e-prefill"
		if o.Prefillers > 1 {
			label = fmt.Sprintf("e-prefill-%d", i+1)
		}
		p, err := r.engine(ctx, label, "prefill", prefillArgs...)
		if err != nil {
			return env, err
		}
		env.prefillers[i] = p
	}
	var err error
	if env.decode, err = r.engine(ctx, "e-decode", "decode", engineArgs...); err != nil {
		return env, err
	}
	if m.with() && sidecarFlags[sidecarSideChannelFlag] {
		// The decode engine's side channel, on this machine's loopback
		// address, which is the sidecar's pod address here (--host). A
		// build without the flag checks no port and takes loopback.
		sidecarArgs = append(sidecarArgs, "--host", "127.0.0.1", "--decode-side-channel-port", itoa(env.decode.kvPort))
	}
	env.side, err = r.sidecar(ctx, "s-sidecar", env.decode, append([]string{"--kv-connector", "nixlv2"}, sidecarArgs...)...)
	return env, err
}

// runMode starts one mode's processes, drives the conversations, samples
// the decode engine's pins through the tail and stops the processes;
// sidecarFlags are the flags the pd-sidecar binary lists.
func runMode(ctx context.Context, o Options, m mode, abandoned []bool, prefixCache bool, sidecarFlags flagSet) (*modeResult, error) {
	// A mode's folder: its name with the TTL's '@' kept (a valid file name).
	r := &rig{bin: o.Bin, dir: filepath.Join(o.Dir, m.name)}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, fmt.Errorf("--dir: %w", err)
	}
	defer r.stop()
	env, err := startMode(ctx, r, o, m, prefixCache, sidecarFlags)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Out, "\n== mode %s: decode engine %s, sidecar %s; %s ==\n", m.name, env.decode.hostPort(), env.side.hostPort(), m.describe(o.SessionHeader, o.PodName))

	client := newChatClient(env.side.url(), o.Timeout, nil)
	defer client.close()
	podToken := PodSessionToken(o.PodName)
	// A warm-up turn through every prefiller opens the connections, so
	// that the first measured turn pays no more than the others; it names
	// a session of its own even in the pod mode, and its pin is gone by
	// its TTL or replaced.
	for i, p := range env.prefillers {
		h := map[string]string{prefillerHeader: p.hostPort()}
		if m.token != TokenNone {
			h[o.SessionHeader] = fmt.Sprintf("warm-up-%d", i)
		}
		if err := warmUp(ctx, client, h); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}

	convs := make([]*Conversation, o.Conversations)
	for i := range convs {
		convs[i] = NewConversation(o.Seed, i, o.Turns, o.UserWords, o.MaxTokens)
	}
	mr := &modeResult{mode: m, turns: make([][]*turnRec, len(convs)), abandoned: abandoned, ledger: true}
	start, err := readCounters(ctx, env.prefillers, env.decode, env.side)
	if err != nil {
		return nil, err
	}
	sampler := startSampler(ctx, env.decode, env.side, o.SampleEvery)
	before := start
	for turn := 1; turn <= o.Turns; turn++ {
		if turn > 1 {
			select {
			case <-ctx.Done():
				sampler.stop()
				return nil, ctx.Err()
			case <-time.After(o.ThinkTime):
			}
		}
		prefiller := env.prefillers[(turn-1)%len(env.prefillers)].hostPort()
		recs, err := runTurn(ctx, client, o, m, convs, turn, abandoned, sampler.t0, func(c *Conversation) map[string]string {
			h := m.sessionHeaders(o.SessionHeader, c.ID, podToken)
			h[prefillerHeader] = prefiller
			return h
		})
		if err != nil {
			sampler.stop()
			return nil, err
		}
		for i, rec := range recs {
			if rec == nil {
				continue
			}
			if rec.usageMismatch {
				mr.usageMismatches++
			}
			if prev := mr.turns[i]; len(prev) > 0 {
				p := prev[len(prev)-1]
				rec.newTokens = rec.promptTokens - p.promptTokens - p.completionTokens
			} else {
				rec.newTokens = rec.promptTokens
			}
			mr.turns[i] = append(mr.turns[i], rec)
		}
		if err := readLedgers(ctx, append(slices.Clone(env.prefillers), env.decode), recs); err != nil {
			if !errors.Is(err, errNoLedger) {
				sampler.stop()
				return nil, err
			}
			mr.ledger = false
		}
		after, err := readCounters(ctx, env.prefillers, env.decode, env.side)
		if err != nil {
			sampler.stop()
			return nil, err
		}
		mr.perTurn = append(mr.perTurn, turnCounters{uses: after.uses - before.uses, misses: after.missTotal - before.missTotal})
		fmt.Fprintf(o.Out, "  turn %d/%d done (%.1f s)\n", turn, o.Turns, time.Since(sampler.t0).Seconds())
		before = after
	}
	lastAnswer := time.Since(sampler.t0)
	tail := min(o.Tail, m.ttl+time.Second)
	if !m.with() {
		tail = min(o.Tail, time.Second)
	}
	held := sampler.waitDrained(ctx, tail)
	mr.pinned = sampler.stop()
	mr.pinned.lastAnswer = lastAnswer
	fmt.Fprintf(o.Out, "  tail: %.1f s after the last answer, %d blocks held at its end\n", (mr.pinned.end - lastAnswer).Seconds(), held)
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

// runTurn sends turn turn of every conversation still going at once and
// waits for every answer. It returns a record per conversation, nil for
// those that abandoned.
func runTurn(ctx context.Context, client *chatClient, o Options, m mode, convs []*Conversation, turn int, abandoned []bool,
	t0 time.Time, headers func(*Conversation) map[string]string) ([]*turnRec, error) {
	recs := make([]*turnRec, len(convs))
	errs := make([]error, len(convs))
	var wg sync.WaitGroup
	for i, c := range convs {
		if turn > 1 && abandoned[i] {
			continue
		}
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
			// The request id names the mode, the conversation and the turn:
			// the engines' ledgers are read by it.
			rec := &turnRec{id: fmt.Sprintf("%s-t%d-%s", c.ID, turn, requestIDSafe(m.name)), sent: time.Since(t0)}
			h := headers(c)
			h["X-Request-Id"] = rec.id
			res, err := client.send(ctx, body, h)
			if err != nil {
				errs[i] = fmt.Errorf("%s turn %d: %w", c.ID, turn, err)
				return
			}
			rec.ended = time.Since(t0)
			if err := c.Answer(res.Content); err != nil {
				errs[i] = err
				return
			}
			rec.promptTokens, rec.completionTokens = res.PromptTokens, res.CompletionTokens
			rec.usageMismatch = res.PromptTokens > 0 && res.PromptTokens != PromptTokens(msgs)
			if rec.promptTokens == 0 {
				// The stream reported no usage: the bench's count of
				// engine-sim's tokens stands in.
				rec.promptTokens, rec.completionTokens = PromptTokens(msgs), res.Tokens
			}
			rec.ttft, rec.answer = res.TTFT, res.Content
			recs[i] = rec
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return recs, nil
}

// requestIDSafe keeps the characters a request id may hold (letters,
// digits, - _ . :), so the sidecar keeps the id on both legs.
func requestIDSafe(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			b[i] = '.'
		}
	}
	return string(b)
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
