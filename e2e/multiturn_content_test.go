package e2e

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// podSessionToken is x-session-token as llm-d's endpoint picker sets it for
// session affinity: the decode pod's namespace/name in base64 — one value
// for every conversation the pod serves.
var podSessionToken = base64.StdEncoding.EncodeToString([]byte("default/decode-0"))

// turnWith sends msgs (with the extra body members) as one split turn,
// with the pod's session token, and returns the answer.
func (r *mtRig) turnWith(t *testing.T, msgs []map[string]any, extra map[string]any, stream bool) mtAnswer {
	t.Helper()
	req := map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": 24, "stream": stream}
	for k, v := range extra {
		req[k] = v
	}
	body, _ := json.Marshal(req)
	resp, b := exchangeRaw(t, r.sc.Port, "/v1/chat/completions", string(body),
		map[string]string{"x-prefiller-host-port": r.prefill.HostPort(), "x-session-token": podSessionToken}, r.whole)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	harness.Eventually(t, 30*time.Second, "the request ended", func() bool {
		return r.sc.Metric(t, "pd_sidecar_inflight_requests", nil) == 0
	})
	return readChat(t, b, stream)
}

// localWith is localTurn with the extra body members.
func (r *mtRig) localWith(t *testing.T, msgs []map[string]any, extra map[string]any) mtAnswer {
	t.Helper()
	req := map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": 24}
	for k, v := range extra {
		req[k] = v
	}
	body, _ := json.Marshal(req)
	code, b, _ := scPost(t, r.ref.URL()+"/v1/chat/completions", string(body), nil)
	require.Equal(t, http.StatusOK, code, "%s", b)
	return readChat(t, b, false)
}

// TestMultiturnConversationsShareThePodsToken: four conversations, all
// carrying the one x-session-token llm-d's picker gives every request for
// this decode pod, take turns in an interleaved order. Every turn from the
// second on finds its own conversation's history by its content: the
// sidecar counts a use, the prefiller pulls blocks and computes less than
// half the prompt, and the answer is token-exact against the same turn
// served from scratch — a history of another conversation would change it.
func TestMultiturnConversationsShareThePodsToken(t *testing.T) {
	drivers(t, func(t *testing.T, whole bool) {
		r := newMTRig(t, whole, nil, nil)
		const convs, turns = 4, 3
		hist := make([][]map[string]any, convs)
		for c := range convs {
			hist[c] = []map[string]any{user(uint64(100+c), 120)}
		}
		for turn := range turns {
			for _, c := range []int{2, 0, 3, 1} {
				before := r.counts(t)
				a := r.turnWith(t, hist[c], nil, (turn+c)%2 == 0)
				after := r.counts(t)
				want := r.localWith(t, hist[c], nil)
				assert.Equal(t, want.content, a.content, "conversation %d turn %d: token-exact against a local run", c, turn+1)
				if turn > 0 {
					assert.Equal(t, before.uses+1, after.uses, "conversation %d turn %d used a history", c, turn+1)
					assert.Greater(t, after.pulledBlocks, before.pulledBlocks, "conversation %d turn %d: blocks pulled", c, turn+1)
					assert.Less(t, after.computed-before.computed, float64(want.promptTokens)/2, "conversation %d turn %d: only what is new computed", c, turn+1)
				} else {
					assert.Equal(t, before.uses, after.uses)
				}
				hist[c] = append(hist[c], a.message(false), user(uint64(200+10*c+turn), 60))
			}
		}
		assert.Equal(t, float64(convs*(turns-1)), r.sc.Metric(t, "pd_sidecar_multiturn_uses_total", nil))
		assert.Equal(t, 0.0, r.sc.Metric(t, "pd_sidecar_multiturn_misses_total", map[string]string{"reason": "prefix_mismatch"}))
		assert.Equal(t, 0.0, r.sc.Metric(t, "pd_sidecar_fallbacks_total", nil))
		assert.Greater(t, r.sc.Metric(t, "pd_sidecar_multiturn_pinned_tokens", nil), 0.0, "the last turns' pins are held")
	})
}

// TestMultiturnTenantsNeverShareAHistory: two tenants (cache_salt, vLLM's
// per-tenant prefix-cache isolation) behind the same pod token. Tenant b
// sending tenant a's conversation, word for word, gets nothing of a's
// history: no use, no block pulled, the whole prompt computed on the
// prefiller (so its time to first token tells it nothing of a) — and a's
// own next turn still finds the history.
func TestMultiturnTenantsNeverShareAHistory(t *testing.T) {
	drivers(t, func(t *testing.T, whole bool) {
		r := newMTRig(t, whole, nil, nil)
		a, b := map[string]any{"cache_salt": "tenant-a"}, map[string]any{"cache_salt": "tenant-b"}
		first := []map[string]any{user(300, 120)}
		ans := r.turnWith(t, first, a, false)
		msgs := append(append([]map[string]any{}, first...), ans.message(false), user(301, 60))

		before := r.counts(t)
		got := r.turnWith(t, msgs, b, true)
		after := r.counts(t)
		want := r.localWith(t, msgs, b)
		assert.Equal(t, want.content, got.content, "token-exact")
		assert.Equal(t, before.uses, after.uses, "tenant b used no history")
		assert.Equal(t, before.pulledBlocks, after.pulledBlocks, "the prefiller pulled nothing for tenant b")
		assert.GreaterOrEqual(t, after.computed-before.computed, float64(want.promptTokens-1), "tenant b's whole prompt computed")
		assert.Equal(t, before.misses["no_entry"]+1, after.misses["no_entry"], "nothing held under tenant b")

		before = r.counts(t)
		got = r.turnWith(t, msgs, a, false)
		after = r.counts(t)
		assert.Equal(t, r.localWith(t, msgs, a).content, got.content)
		assert.Equal(t, before.uses+1, after.uses, "tenant a's turn used its history")
		assert.Greater(t, after.pulledBlocks, before.pulledBlocks)
	})
}
