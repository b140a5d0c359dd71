package enginesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// computed reads an engine's GET /sim/computed by request id.
func computed(t *testing.T, s *testSim) map[string]LedgerEntry {
	t.Helper()
	resp, err := http.Get(s.url + "/sim/computed")
	require.NoError(t, err)
	defer resp.Body.Close()
	var list []LedgerEntry
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	out := map[string]LedgerEntry{}
	for _, e := range list {
		out[e.RequestID] = e
	}
	return out
}

// Each request's entry holds what it added to the computed-tokens counter,
// the history it pulled instead, and the pin a decode leg made.
func TestLedgerTwoTurns(t *testing.T) {
	e := startBidi(t, nil, nil)
	bs := e.p.cfg.BlockSize
	user1 := map[string]any{"role": "user", "content": longPrompt(30)}
	user2 := map[string]any{"role": "user", "content": "and now a second question with a few more words in it"}
	msgs1 := []map[string]any{user1}

	pre1 := post(t, e.p.url+"/v1/chat/completions", turnBody(msgs1, 1, freshPrefillKV(), ""), "X-Request-Id", "turn-1")
	require.Equal(t, 200, pre1.status, "%s", pre1.body)
	kv1 := get(pre1.json, "kv_transfer_params")
	dec1 := post(t, e.d.url+"/v1/chat/completions", turnBody(msgs1, 100, kv1, ""), "X-Request-Id", "turn-1")
	require.Equal(t, 200, dec1.status, "%s", dec1.body)
	pin := get(dec1.json, "kv_transfer_params")
	msgs2 := []map[string]any{user1, assistantOf(dec1), user2}
	before := e.p.metric(t, "sim_prefill_computed_tokens_total")
	pre2 := post(t, e.p.url+"/v1/chat/completions", turnBody(msgs2, 1, pin, ""), "X-Request-Id", "turn-2")
	require.Equal(t, 200, pre2.status, "%s", pre2.body)
	grew := e.p.metric(t, "sim_prefill_computed_tokens_total") - before

	p, d := computed(t, e.p), computed(t, e.d)
	prompt1, prompt2 := chatTokens(t, msgs1), chatTokens(t, msgs2)
	seq := len(prompt1) + len(Tokenize(outputOf(dec1)))
	hb, hits := min(seq-1, len(prompt2)-1)/bs, len(prompt1)/bs
	require.Greater(t, (hb-hits)*bs, e.p.cfg.KVRecomputeThreshold, "turn 2 pulls its history")
	for _, tc := range []struct {
		name string
		got  LedgerEntry
		want LedgerEntry
	}{
		{"turn 1 prefill: the whole prompt", p["turn-1"],
			LedgerEntry{RequestID: "turn-1", Leg: "prefill", PromptTokens: len(prompt1), ComputedTokens: len(prompt1)}},
		{"turn 1 decode: nothing computed, the sequence pinned", d["turn-1"],
			LedgerEntry{RequestID: "turn-1", Leg: "decode", PromptTokens: len(prompt1), PinnedBlocks: (seq + bs - 1) / bs, PinnedTokens: seq}},
		{"turn 2 prefill: the counter's growth, the history pulled past the cached blocks", p["turn-2"],
			LedgerEntry{RequestID: "turn-2", Leg: "prefill", PromptTokens: len(prompt2), ComputedTokens: int(grew), HistoryTokens: (hb - hits) * bs}},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, tc.got) })
	}
	assert.Equal(t, len(prompt2)-hb*bs, int(grew))
}

// The ledger keeps the last entries up to its limit.
func TestLedgerLimit(t *testing.T) {
	for _, tc := range []struct{ limit, added, kept int }{{3, 2, 2}, {3, 3, 3}, {3, 7, 3}} {
		t.Run(fmt.Sprintf("%d of limit %d", tc.added, tc.limit), func(t *testing.T) {
			l := newLedger(tc.limit)
			for i := range tc.added {
				l.add(LedgerEntry{RequestID: fmt.Sprint(i)})
			}
			got := l.list()
			require.Len(t, got, tc.kept)
			assert.Equal(t, fmt.Sprint(tc.added-1), got[len(got)-1].RequestID, "the newest kept last")
		})
	}
}
