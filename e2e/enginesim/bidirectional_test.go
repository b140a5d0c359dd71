package enginesim

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freshPrefillKV is a first turn's prefill leg kv_transfer_params.
func freshPrefillKV() map[string]any {
	return map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
}

func turnBody(msgs []map[string]any, maxTokens int, kv any, extra string) string {
	b := `{"model":"sim-model","messages":` + mustJSON(msgs) + `,"max_tokens":` + strconv.Itoa(maxTokens)
	if kv != nil {
		b += `,"kv_transfer_params":` + mustJSON(kv)
	}
	return b + extra + "}"
}

// bidiEngines are a prefill and a decode engine with bidirectional KV
// transfer, and a fresh engine without it that serves the local runs.
type bidiEngines struct {
	p, d, local *testSim
}

const bidiReasoning = 8

func startBidi(t *testing.T, pMut, dMut func(*Config)) bidiEngines {
	t.Helper()
	on := func(mut func(*Config)) func(*Config) {
		return func(c *Config) {
			c.BidirectionalKVXfer, c.ReasoningTokens = true, bidiReasoning
			if mut != nil {
				mut(c)
			}
		}
	}
	return bidiEngines{
		p:     startSim(t, RolePrefill, on(pMut)),
		d:     startSim(t, RoleDecode, on(dMut)),
		local: startSim(t, RoleBoth, func(c *Config) { c.ReasoningTokens = bidiReasoning }),
	}
}

// prefillChat sends a chat prefill leg carrying kv and returns its answer.
func prefillChat(t *testing.T, p *testSim, msgs []map[string]any, kv any) answer {
	t.Helper()
	a := post(t, p.url+"/v1/chat/completions", turnBody(msgs, 1, kv, ""))
	require.Equal(t, 200, a.status, "%s", a.body)
	return a
}

// decodeChat sends a chat decode leg with the prefill answer's params.
func decodeChat(t *testing.T, d *testSim, msgs []map[string]any, pre answer, maxTokens int) answer {
	t.Helper()
	kv, ok := get(pre.json, "kv_transfer_params").(map[string]any)
	require.True(t, ok, "the prefill answer carries kv_transfer_params: %s", pre.body)
	a := post(t, d.url+"/v1/chat/completions", turnBody(msgs, maxTokens, kv, ""))
	require.Equal(t, 200, a.status, "%s", a.body)
	return a
}

// assistantOf is the assistant message that carries a chat answer back.
func assistantOf(a answer) map[string]any {
	m := map[string]any{"role": "assistant", "content": get(a.json, "choices", 0, "message", "content")}
	if r := get(a.json, "choices", 0, "message", "reasoning_content"); r != nil {
		m["reasoning_content"] = r
	}
	return m
}

// chatTokens is the prompt a chat request's messages render to.
func chatTokens(t *testing.T, msgs []map[string]any) []int {
	t.Helper()
	g, err := parseRequest(apiChat, []byte(turnBody(msgs, 1, nil, "")), 16)
	require.NoError(t, err)
	return g.prompt
}

// outputOf is a chat answer's whole output text: reasoning, then content.
func outputOf(a answer) string {
	r, _ := get(a.json, "choices", 0, "message", "reasoning_content").(string)
	c, _ := get(a.json, "choices", 0, "message", "content").(string)
	return r + c
}

func TestBidirectionalHistoryReuse(t *testing.T) {
	user1 := map[string]any{"role": "user", "content": longPrompt(30)}
	user2 := map[string]any{"role": "user", "content": "now tell me more about that and add some detail to every part of it"}
	cases := []struct {
		name string
		// history edits the assistant message turn 2 carries back.
		history func(m map[string]any)
		// same: the split turn 2 gives the local run's tokens.
		same bool
	}{
		{"verbatim answer with its reasoning", func(map[string]any) {}, true},
		{"reasoning carried back as reasoning", func(m map[string]any) {
			m["reasoning"] = m["reasoning_content"]
			delete(m, "reasoning_content")
		}, true},
		{"reasoning stripped", func(m map[string]any) { delete(m, "reasoning_content") }, false},
		{"content edited", func(m map[string]any) {
			words := strings.Fields(m["content"].(string))
			words[0] = "edited"
			m["content"] = " " + strings.Join(words, " ")
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := startBidi(t, nil, nil)
			bs := e.p.cfg.BlockSize
			msgs1 := []map[string]any{user1}
			prompt1 := chatTokens(t, msgs1)

			// Turn 1, split: the decode leg pins its sequence.
			dec1 := decodeChat(t, e.d, msgs1, prefillChat(t, e.p, msgs1, freshPrefillKV()), 100)
			pin, ok := get(dec1.json, "kv_transfer_params").(map[string]any)
			require.True(t, ok, "the decode answer names its pin: %s", dec1.body)
			seq := len(prompt1) + len(Tokenize(outputOf(dec1)))
			assert.Equal(t, false, pin["do_remote_prefill"])
			assert.Equal(t, true, pin["do_remote_decode"])
			assert.Equal(t, e.d.EngineID(), pin["remote_engine_id"])
			assert.Equal(t, "127.0.0.1", pin["remote_host"])
			assert.EqualValues(t, e.d.KVAddr().Port, pin["remote_port"])
			assert.EqualValues(t, 1, pin["tp_size"])
			assert.EqualValues(t, seq-1, pin["remote_num_tokens"])
			assert.Equal(t, "pull", pin["transfer_mode"])
			assert.NotEmpty(t, pin["remote_request_id"])
			assert.Greater(t, pin["remote_blocks_expiry_time"].(float64), 479.0, "a fixed deadline 480 s from the pin, on D's clock")
			assert.Len(t, get(pin, "remote_block_ids", 0), (seq+bs-1)/bs)
			assert.EqualValues(t, (seq+bs-1)/bs, e.d.metric(t, "sim_kv_blocks_held"), "the pin shows among the held blocks")
			assert.Equal(t, 1.0, e.d.metric(t, "sim_bidirectional_pins_total"))
			assert.Equal(t, 0.0, e.p.metric(t, "sim_bidirectional_pins_total"), "a prefill leg pins nothing")

			// Turn 2: the prompt carries turn 1's answer back.
			hist := assistantOf(dec1)
			tc.history(hist)
			msgs2 := []map[string]any{user1, hist, user2}
			prompt2 := chatTokens(t, msgs2)
			computedBefore := e.p.metric(t, "sim_prefill_computed_tokens_total")
			pre2 := prefillChat(t, e.p, msgs2, pin)
			hb := min(seq-1, len(prompt2)-1) / bs
			hits := len(prompt1) / bs // the prefill engine computed turn 1's prompt
			assert.Equal(t, 1.0, e.p.metric(t, "sim_bidirectional_history_pulls_total"))
			assert.EqualValues(t, hb-hits, e.p.metric(t, "sim_bidirectional_history_blocks_pulled_total"))
			assert.Greater(t, hb-hits, 0)
			computed := e.p.metric(t, "sim_prefill_computed_tokens_total") - computedBefore
			assert.EqualValues(t, len(prompt2)-hb*bs, computed, "only the prompt past the history is computed")
			assert.Less(t, int(computed), len(prompt2)-seq+bs, "about the new tokens")
			assert.EqualValues(t, hb*bs, get(pre2.json, "usage", "prompt_tokens_details", "cached_tokens"))
			assert.Equal(t, true, get(pre2.json, "kv_transfer_params", "do_remote_prefill"), "a normal prefill answer")
			dec2 := decodeChat(t, e.d, msgs2, pre2, 12)
			pin2, ok := get(dec2.json, "kv_transfer_params").(map[string]any)
			require.True(t, ok)
			require.Eventually(t, func() bool {
				return e.d.HeldBlocks() == len(get(pin2, "remote_block_ids", 0).([]any))
			}, 30*time.Second, time.Millisecond, "the first pin is freed once pulled; the second stays")

			local := post(t, e.local.url+"/v1/chat/completions", turnBody(msgs2, 12, nil, ""))
			require.Equal(t, 200, local.status)
			if tc.same {
				assert.Equal(t, get(local.json, "choices", 0, "message"), get(dec2.json, "choices", 0, "message"), "history reuse = local run, token for token")
			} else {
				assert.NotEqual(t, outputOf(local), outputOf(dec2), "a history that is not the prompt's prefix gives wrong KV")
			}
		})
	}
}

func TestBidirectionalCompletions(t *testing.T) {
	e := startBidi(t, nil, nil)
	prompt1 := longPrompt(40)
	a := post(t, e.p.url+"/v1/completions", `{"model":"sim-model","prompt":`+mustJSON(prompt1)+`,"max_tokens":1,`+prefillKV+`}`)
	require.Equal(t, 200, a.status)
	dec1 := post(t, e.d.url+"/v1/completions", decodeBody(prompt1, get(a.json, "kv_transfer_params").(map[string]any), `,"max_tokens":100`))
	require.Equal(t, 200, dec1.status, "%s", dec1.body)
	pin := get(dec1.json, "kv_transfer_params").(map[string]any)
	prompt2 := prompt1 + get(dec1.json, "choices", 0, "text").(string) + " and then some more words to finish"
	pre2 := post(t, e.p.url+"/v1/completions", `{"model":"sim-model","prompt":`+mustJSON(prompt2)+`,"max_tokens":1,"kv_transfer_params":`+mustJSON(pin)+`}`)
	require.Equal(t, 200, pre2.status, "%s", pre2.body)
	assert.Greater(t, e.p.metric(t, "sim_bidirectional_history_blocks_pulled_total"), 0.0)
	dec2 := post(t, e.d.url+"/v1/completions", decodeBody(prompt2, get(pre2.json, "kv_transfer_params").(map[string]any), ""))
	require.Equal(t, 200, dec2.status, "%s", dec2.body)
	local := post(t, e.local.url+"/v1/completions", `{"model":"sim-model","prompt":`+mustJSON(prompt2)+`,"max_tokens":6}`)
	assert.Equal(t, get(local.json, "choices", 0, "text"), get(dec2.json, "choices", 0, "text"))
}

func TestBidirectionalBelowThreshold(t *testing.T) {
	e := startBidi(t, nil, nil)
	msgs1 := []map[string]any{{"role": "user", "content": longPrompt(30)}}
	dec1 := decodeChat(t, e.d, msgs1, prefillChat(t, e.p, msgs1, freshPrefillKV()), 20)
	pin := get(dec1.json, "kv_transfer_params").(map[string]any)
	require.Positive(t, e.d.HeldBlocks())
	msgs2 := append(msgs1, assistantOf(dec1), map[string]any{"role": "user", "content": "go on"})
	pre2 := prefillChat(t, e.p, msgs2, pin)
	assert.Equal(t, 1.0, e.p.metric(t, "sim_bidirectional_recomputed_below_threshold_total"), "16 history tokens to pull, threshold 64")
	assert.Equal(t, 0.0, e.p.metric(t, "sim_bidirectional_history_pulls_total"))
	assert.Equal(t, 0.0, e.p.metric(t, "sim_bidirectional_history_blocks_pulled_total"))
	require.Eventually(t, func() bool { return e.d.HeldBlocks() == 0 }, 30*time.Second, time.Millisecond,
		"the prefill tells the decode engine to free the pin it did not pull")
	dec2 := decodeChat(t, e.d, msgs2, pre2, 8)
	local := post(t, e.local.url+"/v1/chat/completions", turnBody(msgs2, 8, nil, ""))
	assert.Equal(t, get(local.json, "choices", 0, "message"), get(dec2.json, "choices", 0, "message"))
}

func TestBidirectionalHistoryPullFailure(t *testing.T) {
	unused := func(t *testing.T) int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
		return port
	}
	cases := []struct {
		name    string
		policy  string
		expired bool // the pin expires; otherwise the decode engine is unreachable
		status  int
	}{
		{"expired pin, fail", PolicyFail, true, 500},
		{"expired pin, recompute", PolicyRecompute, true, 200},
		{"unreachable decode engine, fail", PolicyFail, false, 500},
		{"unreachable decode engine, recompute", PolicyRecompute, false, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := startBidi(t, func(c *Config) { c.KVLoadFailurePolicy = tc.policy }, func(c *Config) {
				if tc.expired {
					c.DecoderKVBlocksTTL = 20 * time.Millisecond
				}
			})
			msgs1 := []map[string]any{{"role": "user", "content": longPrompt(30)}}
			dec1 := decodeChat(t, e.d, msgs1, prefillChat(t, e.p, msgs1, freshPrefillKV()), 100)
			pin := get(dec1.json, "kv_transfer_params").(map[string]any)
			if tc.expired {
				require.Eventually(t, func() bool { return e.d.HeldBlocks() == 0 }, 30*time.Second, time.Millisecond)
				assert.Equal(t, 1.0, e.d.metric(t, "sim_kv_lease_expired_total"))
			} else {
				pin["remote_port"] = unused(t)
			}
			msgs2 := append(msgs1, assistantOf(dec1), map[string]any{"role": "user", "content": "go on"})
			computedBefore := e.p.metric(t, "sim_prefill_computed_tokens_total")
			pre2 := post(t, e.p.url+"/v1/chat/completions", turnBody(msgs2, 1, pin, ""))
			require.Equal(t, tc.status, pre2.status, "%s", pre2.body)
			assert.Equal(t, 1.0, e.p.metric(t, "sim_bidirectional_history_pull_failures_total"))
			assert.Equal(t, 0.0, e.p.metric(t, "sim_bidirectional_history_pulls_total"))
			if tc.status == 500 {
				assert.JSONEq(t, string(internalErrorBody()), string(pre2.body))
				return
			}
			prompt2 := chatTokens(t, msgs2)
			assert.EqualValues(t, len(prompt2)-len(chatTokens(t, msgs1))/16*16, e.p.metric(t, "sim_prefill_computed_tokens_total")-computedBefore,
				"recompute: all but the prefix cache's hits")
			dec2 := decodeChat(t, e.d, msgs2, pre2, 8)
			local := post(t, e.local.url+"/v1/chat/completions", turnBody(msgs2, 8, nil, ""))
			assert.Equal(t, get(local.json, "choices", 0, "message"), get(dec2.json, "choices", 0, "message"))
		})
	}
}

func TestBidirectionalPinsOnlyDecodeLegs(t *testing.T) {
	d := startSim(t, RoleDecode, func(c *Config) { c.BidirectionalKVXfer = true })
	require.NotNil(t, d.KVAddr(), "a decode engine with bidirectional transfer listens on its KV side channel")
	off := startSim(t, RoleDecode, nil)
	assert.Nil(t, off.KVAddr(), "and one without does not")
	a := post(t, d.url+"/v1/chat/completions", turnBody([]map[string]any{{"role": "user", "content": "hi"}}, 4, nil, ""))
	require.Equal(t, 200, a.status)
	assert.Nil(t, get(a.json, "kv_transfer_params"), "a local request pins nothing")
	status, evs, err := stream(t, d.url+"/v1/completions", `{"model":"sim-model","prompt":"hi","max_tokens":3,"stream":true}`)
	require.NoError(t, err)
	require.Equal(t, 200, status)
	for _, ev := range evs {
		assert.NotContains(t, ev.data, "kv_transfer_params")
	}
	assert.Equal(t, 0.0, d.metric(t, "sim_bidirectional_pins_total"))
	assert.Equal(t, 0, d.HeldBlocks())

	// A pin is read by history pulls only: a decode leg naming it as a
	// prefiller's hold fails to load.
	p := startSim(t, RolePrefill, nil)
	prompt := longPrompt(20)
	dec := post(t, d.url+"/v1/completions", decodeBody(prompt, nixlPrefill(t, p, prompt), ""))
	require.Equal(t, 200, dec.status, "%s", dec.body)
	pin := get(dec.json, "kv_transfer_params").(map[string]any)
	pin["do_remote_prefill"], pin["do_remote_decode"] = true, false
	other := startSim(t, RoleDecode, nil)
	assert.Equal(t, 500, post(t, other.url+"/v1/completions", decodeBody(prompt, pin, "")).status)
	assert.Equal(t, 1.0, other.metric(t, "sim_kv_load_failures_total"))
	assert.Positive(t, d.HeldBlocks(), "the refused pull leaves the pin")
}

func TestBidirectionalStreamedPin(t *testing.T) {
	prompt := longPrompt(30)
	msgs := []map[string]any{{"role": "user", "content": prompt}}
	cases := []struct {
		name, path string
		// body is the streamed decode leg's body after its prefill on p.
		body func(p *testSim) string
	}{
		{"chat", "/v1/chat/completions", func(p *testSim) string {
			kv := get(prefillChat(t, p, msgs, freshPrefillKV()).json, "kv_transfer_params")
			return turnBody(msgs, 5, kv, `,"stream":true`)
		}},
		{"completions", "/v1/completions", func(p *testSim) string {
			return decodeBody(prompt, nixlPrefill(t, p, prompt), `,"stream":true`)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := startBidi(t, nil, nil)
			status, evs, err := stream(t, e.d.url+tc.path, tc.body(e.p))
			require.NoError(t, err)
			require.Equal(t, 200, status)
			require.Equal(t, "[DONE]", evs[len(evs)-1].data)
			final := evs[len(evs)-2].obj(t)
			assert.Equal(t, "length", get(final, "choices", 0, "finish_reason"))
			pin, ok := final["kv_transfer_params"].(map[string]any)
			require.True(t, ok, "the chunk with the finish_reason carries the pin: %s", evs[len(evs)-2].data)
			assert.Equal(t, e.d.EngineID(), pin["remote_engine_id"])
			assert.Equal(t, true, pin["do_remote_decode"])
			assert.Len(t, get(pin, "remote_block_ids", 0), e.d.HeldBlocks())
			for _, ev := range evs[:len(evs)-2] {
				assert.NotContains(t, ev.data, "kv_transfer_params", "only the final chunk carries it")
			}
		})
	}
}

func TestReasoningTokens(t *testing.T) {
	r := startSim(t, RoleBoth, func(c *Config) { c.ReasoningTokens = 3 })
	plain := startSim(t, RoleBoth, nil)
	body := turnBody([]map[string]any{{"role": "user", "content": "why is the sky blue"}}, 5, nil, "")
	want := post(t, plain.url+"/v1/chat/completions", body)
	words := strings.Fields(get(want.json, "choices", 0, "message", "content").(string))
	require.Len(t, words, 5)
	assert.Nil(t, get(want.json, "choices", 0, "message", "reasoning_content"), "no reasoning without --reasoning-tokens")

	a := post(t, r.url+"/v1/chat/completions", body)
	require.Equal(t, 200, a.status)
	assert.Equal(t, " "+strings.Join(words[:3], " "), get(a.json, "choices", 0, "message", "reasoning_content"))
	assert.Equal(t, " "+strings.Join(words[3:], " "), get(a.json, "choices", 0, "message", "content"))
	assert.EqualValues(t, 5, get(a.json, "usage", "completion_tokens"))

	all := post(t, r.url+"/v1/chat/completions", turnBody([]map[string]any{{"role": "user", "content": "why is the sky blue"}}, 2, nil, ""))
	msg := get(all.json, "choices", 0, "message").(map[string]any)
	assert.Equal(t, " "+strings.Join(words[:2], " "), msg["reasoning_content"])
	assert.Contains(t, msg, "content")
	assert.Nil(t, msg["content"], "no content after the reasoning")

	status, evs, err := stream(t, r.url+"/v1/chat/completions", turnBody([]map[string]any{{"role": "user", "content": "why is the sky blue"}}, 5, nil, `,"stream":true`))
	require.NoError(t, err)
	require.Equal(t, 200, status)
	require.Len(t, evs, 7, "role chunk, 5 tokens, [DONE]")
	for i, ev := range evs[1:6] {
		delta := get(ev.obj(t), "choices", 0, "delta").(map[string]any)
		if i < 3 {
			assert.Equal(t, map[string]any{"reasoning_content": " " + words[i]}, delta)
		} else {
			assert.Equal(t, map[string]any{"content": " " + words[i]}, delta)
		}
	}

	comp := post(t, r.url+"/v1/completions", `{"model":"sim-model","prompt":"why","max_tokens":4}`)
	assert.NotContains(t, string(comp.body), "reasoning", "completions render no reasoning")
}

func TestChatTemplateCarriesReasoning(t *testing.T) {
	withReasoning := func(field string) []int {
		return chatTokens(t, []map[string]any{
			{"role": "user", "content": "q"},
			{"role": "assistant", field: " think hard", "content": " answer"},
			{"role": "user", "content": "next"},
		})
	}
	want := Tokenize(ChatPrompt([]Message{{"user", "q"}, {"assistant", " think hard answer"}, {"user", "next"}}))
	assert.Equal(t, want, withReasoning("reasoning_content"))
	assert.Equal(t, want, withReasoning("reasoning"))
	assert.NotEqual(t, want, chatTokens(t, []map[string]any{
		{"role": "user", "content": "q"}, {"role": "assistant", "content": " answer"}, {"role": "user", "content": "next"},
	}))
	_, err := parseRequest(apiChat, []byte(`{"model":"m","messages":[{"role":"assistant","content":"a","reasoning_content":5}]}`), 16)
	assert.ErrorContains(t, err, "messages[0].reasoning_content")
}
