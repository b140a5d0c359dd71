package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// Multi-turn KV reuse (--enable-bidirectional-kv-xfer) over real
// processes: an engine-sim prefiller and decode engine in bidirectional
// mode (the decode engine pins a finished decode's KV and answers its
// kv_transfer_params; a prefill given them pulls that history over the KV
// side channel and computes only the rest, its KV for the pulled blocks
// being the bytes received), the sidecar in front of the decode engine,
// and a reference engine that serves every turn's body locally, from
// scratch. A turn's answer depends on every byte of its prompt's KV, so a
// turn served with a pulled history is token-exact against the reference
// only if the history was the right one. Every case runs on the lane (the
// request sent whole) and on fasthttp's path (its head in two writes).

// mtRig is the processes of one case.
type mtRig struct {
	prefill, decode, ref *harness.Engine
	sc                   *harness.Sidecar
	whole                bool
}

// newMTRig starts the engines in bidirectional mode (engineFlags to the
// decode engine and the reference, prefillFlags to the prefiller) and the
// sidecar with multi-turn reuse on (scFlags after), told its pod's address
// (POD_IP, as the chart sets it: 127.0.0.1, where the engines listen) and
// the decode engine's side-channel port. The prefiller's prefix
// cache is off, as on a prefill pool whose caches hold none of this
// conversation: every prompt token it does not pull it computes.
func newMTRig(t *testing.T, whole bool, prefillFlags, engineFlags []string, scFlags ...string) *mtRig {
	t.Helper()
	t.Setenv("POD_IP", "127.0.0.1")
	bidi := []string{"--bidirectional-kv-xfer"}
	r := &mtRig{
		prefill: harness.StartEngineSim(t, "prefill", append(append(bidi, "--no-enable-prefix-caching"), prefillFlags...)...),
		decode:  harness.StartEngineSim(t, "decode", append(bidi, engineFlags...)...),
		ref:     harness.StartEngineSim(t, "both", engineFlags...),
		whole:   whole,
	}
	r.sc = harness.StartSidecar(t, r.decode.Port, append([]string{"--enable-bidirectional-kv-xfer", "--decode-side-channel-port", itoa(r.decode.KVPort)}, scFlags...)...)
	return r
}

// mtAnswer is what a client keeps of a chat answer: the message it sends
// back in the next turn.
type mtAnswer struct {
	content, reasoning string
	promptTokens       int
}

// message is the answer as the next turn's assistant message; without
// reasoning when strip is set (as clients that drop a reasoning model's
// thinking do).
func (a mtAnswer) message(strip bool) map[string]any {
	m := map[string]any{"role": "assistant", "content": a.content}
	if a.reasoning != "" && !strip {
		m["reasoning_content"] = a.reasoning
	}
	return m
}

// chatTurn sends msgs to the sidecar as one split turn of session (in the
// x-session-token header; with byBody in the body's conversation_id
// instead) and returns the answer, read from JSON or from the stream. It
// checks that the client saw no kv_transfer_params.
func (r *mtRig) chatTurn(t *testing.T, msgs []map[string]any, session string, stream, byBody bool) mtAnswer {
	t.Helper()
	req := map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": 24, "stream": stream}
	headers := map[string]string{"x-prefiller-host-port": r.prefill.HostPort()}
	if byBody {
		req["conversation_id"] = session
	} else {
		headers["x-session-token"] = session
	}
	if stream {
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	body, _ := json.Marshal(req)
	resp, b := exchangeRaw(t, r.sc.Port, "/v1/chat/completions", string(body), headers, r.whole)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	harness.Eventually(t, 30*time.Second, "the request ended", func() bool {
		return r.sc.Metric(t, "pd_sidecar_inflight_requests", nil) == 0
	})
	return readChat(t, b, stream)
}

// localTurn is the reference: msgs served from scratch by an engine of its
// own, no sidecar, no history.
func (r *mtRig) localTurn(t *testing.T, msgs []map[string]any) mtAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": 24})
	code, b, _ := scPost(t, r.ref.URL()+"/v1/chat/completions", string(body), nil)
	require.Equal(t, http.StatusOK, code, "%s", b)
	return readChat(t, b, false)
}

// readChat reads a chat answer: the JSON body, or the SSE events' deltas.
func readChat(t *testing.T, b []byte, stream bool) mtAnswer {
	t.Helper()
	if !stream {
		require.Equal(t, "null", gjson.GetBytes(b, "kv_transfer_params").Raw, "the client does not get the decode engine's params: %s", b)
		return mtAnswer{
			content:      gjson.GetBytes(b, "choices.0.message.content").String(),
			reasoning:    gjson.GetBytes(b, "choices.0.message.reasoning_content").String(),
			promptTokens: int(gjson.GetBytes(b, "usage.prompt_tokens").Int()),
		}
	}
	var a mtAnswer
	var content, reasoning strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		if p := gjson.Get(data, "kv_transfer_params"); p.Exists() {
			require.Equal(t, "null", p.Raw, "the client does not get the decode engine's params: %s", data)
		}
		content.WriteString(gjson.Get(data, "choices.0.delta.content").String())
		reasoning.WriteString(gjson.Get(data, "choices.0.delta.reasoning_content").String())
		if n := gjson.Get(data, "usage.prompt_tokens"); n.Exists() {
			a.promptTokens = int(n.Int())
		}
	}
	a.content, a.reasoning = content.String(), reasoning.String()
	require.NotEmpty(t, a.content+a.reasoning, "an answer with tokens: %s", b)
	return a
}

// userText is a user message of n words, different for every seed.
func userText(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 7))
	words := make([]string, n)
	for i := range words {
		words[i] = fmt.Sprintf("w%d", rng.IntN(5000))
	}
	return strings.Join(words, " ")
}

func user(seed uint64, n int) map[string]any {
	return map[string]any{"role": "user", "content": userText(seed, n)}
}

// mtCounts are the counters a turn moves.
type mtCounts struct {
	uses, pulledBlocks, pullFailures, computed float64
	misses                                     map[string]float64
}

func (r *mtRig) counts(t *testing.T) mtCounts {
	t.Helper()
	c := mtCounts{
		uses:         r.sc.Metric(t, "pd_sidecar_multiturn_uses_total", nil),
		pulledBlocks: r.prefill.Metric(t, "sim_bidirectional_history_blocks_pulled_total", nil),
		pullFailures: r.prefill.Metric(t, "sim_bidirectional_history_pull_failures_total", nil),
		computed:     r.prefill.Metric(t, "sim_prefill_computed_tokens_total", nil),
		misses:       map[string]float64{},
	}
	for _, reason := range []string{"no_entry", "expired", "prefix_mismatch", "below_threshold", "pull_failed"} {
		c.misses[reason] = r.sc.Metric(t, "pd_sidecar_multiturn_misses_total", map[string]string{"reason": reason})
	}
	return c
}

// lastPrefillHistory reports whether the last prefill leg the prefiller
// received carried a history (remote_block_ids set).
func (r *mtRig) lastPrefillHistory(t *testing.T) bool {
	t.Helper()
	reqs := simRequests(t, r.prefill)
	require.NotEmpty(t, reqs)
	return gjson.GetBytes(reqs[len(reqs)-1].Body, "kv_transfer_params.remote_block_ids").IsArray()
}

// noConversationID checks that no engine saw a conversation_id.
func (r *mtRig) noConversationID(t *testing.T) {
	t.Helper()
	for _, e := range []*harness.Engine{r.prefill, r.decode} {
		for _, req := range simRequests(t, e) {
			assert.False(t, gjson.GetBytes(req.Body, "conversation_id").Exists(), "an engine saw the session key: %s", req.Body)
		}
	}
}

func drivers(t *testing.T, run func(t *testing.T, whole bool)) {
	for _, whole := range []bool{true, false} {
		t.Run(map[bool]string{true: "lane", false: "fasthttp"}[whole], func(t *testing.T) { run(t, whole) })
	}
}

// TestMultiturnHistoryReusedTokenExact: a conversation of three turns,
// each carrying the previous answers back verbatim (the session key in
// the body's conversation_id, which no engine sees). From turn 2 on the
// prefill pulls the history from the decode engine (blocks pulled on the
// prefiller, the prefiller computing fewer tokens than the prompt holds),
// and every answer is token-exact against the same turn served from
// scratch; turn 2 streams, turn 3 is JSON. The client never sees the
// decode engine's params.
func TestMultiturnHistoryReusedTokenExact(t *testing.T) {
	drivers(t, func(t *testing.T, whole bool) {
		r := newMTRig(t, whole, nil, nil)
		msgs := []map[string]any{user(1, 120)}
		a := r.chatTurn(t, msgs, "conv-1", false, true)
		assert.Equal(t, r.localTurn(t, msgs).content, a.content, "turn 1 as served from scratch")
		assert.Equal(t, 1.0, r.decode.Metric(t, "sim_bidirectional_pins_total", nil), "the decode engine pinned turn 1's KV")
		assert.Equal(t, 1.0, r.sc.Metric(t, "pd_sidecar_multiturn_entries_total", map[string]string{"outcome": "kept"}))
		for turn, stream := range []bool{true, false} {
			msgs = append(msgs, a.message(false), user(uint64(turn+2), 80))
			before := r.counts(t)
			a = r.chatTurn(t, msgs, "conv-1", stream, true)
			after := r.counts(t)
			want := r.localTurn(t, msgs)
			assert.Equal(t, want.content, a.content, "turn %d token-exact against a local run", turn+2)
			assert.Equal(t, before.uses+1, after.uses, "turn %d used the history", turn+2)
			assert.Greater(t, after.pulledBlocks, before.pulledBlocks, "the prefiller pulled the history's blocks")
			assert.Less(t, after.computed-before.computed, float64(want.promptTokens)/2, "the prefiller computed only what is new (prompt %d tokens)", want.promptTokens)
			assert.True(t, r.lastPrefillHistory(t), "the prefill leg carried the history")
		}
		assert.Equal(t, 3.0, r.sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
		assert.Equal(t, 0.0, r.sc.Metric(t, "pd_sidecar_fallbacks_total", nil))
		assert.Greater(t, r.sc.Metric(t, "pd_sidecar_multiturn_tokens_reused_total", nil), 200.0)
		if whole {
			assert.Equal(t, 3.0, r.sc.Metric(t, laneRequests, nil), "the lane served every turn")
		} else {
			assert.Equal(t, 0.0, r.sc.Metric(t, laneRequests, nil), "fasthttp served every turn")
		}
		r.noConversationID(t)
	})
}

// TestMultiturnMismatchedHistoryNeverInjected (answers with reasoning kept,
// --bidirectional-keep-reasoning): a reasoning model's answer
// sent back without its reasoning, an edited history, or another
// conversation's text under a borrowed session key do not extend the
// sequence the decode engine holds: the prefill carries no history (the
// prefiller pulls nothing), the miss is counted as prefix_mismatch, and
// the answer is token-exact against a local run. Histories are found by
// their content, so none of these turns takes or replaces the owner's:
// the owner's next turn, extending its own first answer, uses it.
func TestMultiturnMismatchedHistoryNeverInjected(t *testing.T) {
	drivers(t, func(t *testing.T, whole bool) {
		r := newMTRig(t, whole, nil, []string{"--reasoning-tokens", "6"}, "--bidirectional-keep-reasoning")
		first := []map[string]any{user(10, 120)}
		a := r.chatTurn(t, first, "owner", true, false)
		require.NotEmpty(t, a.reasoning, "a reasoning model's answer")
		cases := []struct {
			name    string
			session string
			msgs    []map[string]any
		}{
			{"reasoning stripped", "owner", append(append([]map[string]any{}, first...), a.message(true), user(11, 60))},
			{"history edited", "owner", []map[string]any{user(12, 120), a.message(false), user(11, 60)}},
			{"borrowed session key", "owner", []map[string]any{user(13, 140), {"role": "assistant", "content": "w1 w2 w3"}, user(14, 60)}},
		}
		for _, tc := range cases {
			before := r.counts(t)
			got := r.chatTurn(t, tc.msgs, tc.session, false, false)
			after := r.counts(t)
			assert.Equal(t, r.localTurn(t, tc.msgs).content, got.content, "%s: token-exact against a local run", tc.name)
			assert.Equal(t, before.misses["prefix_mismatch"]+1, after.misses["prefix_mismatch"], "%s: counted", tc.name)
			assert.Equal(t, before.pulledBlocks, after.pulledBlocks, "%s: the prefiller pulled nothing", tc.name)
			assert.Equal(t, before.uses, after.uses, "%s: no use", tc.name)
			assert.False(t, r.lastPrefillHistory(t), "%s: the prefill leg carried no history", tc.name)
		}
		msgs := append(append([]map[string]any{}, first...), a.message(false), user(11, 60))
		before := r.counts(t)
		got := r.chatTurn(t, msgs, "owner", false, false)
		after := r.counts(t)
		assert.Equal(t, r.localTurn(t, msgs).content, got.content)
		assert.Equal(t, before.uses+1, after.uses, "the owner's turn used its own history")
		assert.Greater(t, after.pulledBlocks, before.pulledBlocks)
		assert.Equal(t, before.misses["prefix_mismatch"], after.misses["prefix_mismatch"])
	})
}

// TestMultiturnFallsBack: an entry that expired in the sidecar, a history
// whose blocks the decode engine let go (the prefill's pull fails and it
// answers 500: the sidecar sends it again without the history, counted
// pull_failed, no fallback), a history under the recompute threshold, and
// an answer with reasoning (not kept unless --bidirectional-keep-reasoning)
// are recomputed on the prefiller, and every answer is token-exact.
func TestMultiturnFallsBack(t *testing.T) {
	cases := []struct {
		name          string
		prefillFlags  []string
		engineFlags   []string
		scFlags       []string
		wait          func(t *testing.T, r *mtRig)
		miss          []string // one of these reasons is counted
		pullFailures  float64
		historyPulled bool
	}{
		{name: "entry expired in the sidecar", scFlags: []string{"--bidirectional-cache-ttl", "1s"},
			wait: func(t *testing.T, r *mtRig) {
				harness.Eventually(t, 30*time.Second, "the entry swept", func() bool {
					return r.sc.Metric(t, "pd_sidecar_multiturn_entries", nil) == 0
				})
			},
			miss: []string{"expired", "no_entry"}},
		{name: "blocks let go by the decode engine", engineFlags: []string{"--decoder-kv-blocks-ttl", "500ms"},
			prefillFlags: []string{"--kv-load-failure-policy", "fail"},
			wait: func(t *testing.T, r *mtRig) {
				harness.Eventually(t, 30*time.Second, "the pin expired", func() bool {
					return r.decode.Metric(t, "sim_kv_blocks_held", nil) == 0
				})
			},
			miss: []string{"pull_failed"}, pullFailures: 1, historyPulled: false},
		{name: "under the recompute threshold", scFlags: []string{"--bidirectional-recompute-threshold", "100000"},
			miss: []string{"below_threshold"}},
		{name: "an answer with reasoning, not kept by default", engineFlags: []string{"--reasoning-tokens", "6"},
			miss: []string{"no_entry"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			drivers(t, func(t *testing.T, whole bool) {
				r := newMTRig(t, whole, tc.prefillFlags, tc.engineFlags, tc.scFlags...)
				first := []map[string]any{user(30, 120)}
				a := r.chatTurn(t, first, "s", false, false)
				if tc.wait != nil {
					tc.wait(t, r)
				}
				msgs := append(append([]map[string]any{}, first...), a.message(false), user(31, 60))
				before := r.counts(t)
				got := r.chatTurn(t, msgs, "s", true, false)
				after := r.counts(t)
				assert.Equal(t, r.localTurn(t, msgs).content, got.content, "token-exact against a local run")
				missed := 0.0
				for _, reason := range tc.miss {
					missed += after.misses[reason] - before.misses[reason]
				}
				assert.Equal(t, 1.0, missed, "one miss of %v: %v", tc.miss, after.misses)
				assert.Equal(t, before.uses, after.uses, "no use")
				assert.Equal(t, before.pulledBlocks, after.pulledBlocks, "no history pulled")
				assert.Equal(t, tc.pullFailures, after.pullFailures-before.pullFailures, "the prefiller's failed pulls")
				assert.Equal(t, 0.0, r.sc.Metric(t, "pd_sidecar_fallbacks_total", nil), "no fallback: the prefill answered")
				assert.Equal(t, 2.0, r.sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
			})
		})
	}
}
