package chunked_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/proxy/chunked"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

func TestPlanFor(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name   string
		n      int
		body   string
		chunk  bool
		size   int
		budget int
	}{
		{name: "off", n: 0, body: `{` + msgs + `,"max_tokens":100}`},
		{name: "budget fits one chunk", n: 4, body: `{` + msgs + `,"max_tokens":4}`},
		{name: "max_tokens budget", n: 4, body: `{` + msgs + `,"max_tokens":10}`, chunk: true, size: 4, budget: 10},
		{name: "max_completion_tokens wins", n: 4, body: `{` + msgs + `,"max_tokens":3,"max_completion_tokens":10}`, chunk: true, size: 4, budget: 10},
		{name: "max_completion_tokens fits", n: 4, body: `{` + msgs + `,"max_tokens":100,"max_completion_tokens":4}`},
		{name: "no budget", n: 4, body: `{` + msgs + `}`, chunk: true, size: 4},
		{name: "null cap is none", n: 4, body: `{` + msgs + `,"max_tokens":null}`, chunk: true, size: 4},
		{name: "zero cap: the engine's to refuse", n: 4, body: `{` + msgs + `,"max_tokens":0}`},
		{name: "cap not a number", n: 4, body: `{` + msgs + `,"max_completion_tokens":"ten","max_tokens":10}`},
		{name: "huge budget, larger chunks", n: 1, body: `{` + msgs + `,"max_tokens":1000}`, chunk: true, size: 4, budget: 1000},
		{name: "n > 1", n: 4, body: `{` + msgs + `,"max_tokens":10,"n":2}`},
		{name: "n = 1", n: 4, body: `{` + msgs + `,"max_tokens":10,"n":1}`, chunk: true, size: 4, budget: 10},
		{name: "logprobs", n: 4, body: `{` + msgs + `,"max_tokens":10,"logprobs":true}`},
		{name: "client continues", n: 4, body: `{` + msgs + `,"max_tokens":10,"continue_final_message":true}`},
		{name: "no messages", n: 4, body: `{"max_tokens":10}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, ok := chunked.PlanFor([]byte(tc.body), tc.n)
			require.Equal(t, tc.chunk, ok)
			if ok {
				assert.Equal(t, tc.size, plan.Size())
				assert.Equal(t, tc.budget, plan.Budget())
			}
		})
	}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func chatAnswer(text, finish string, prompt, tokens int) []byte {
	return []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":` +
		quote(text) + `},"finish_reason":"` + finish + `"}],"usage":{"prompt_tokens":` +
		itoa(prompt) + `,"completion_tokens":` + itoa(tokens) + `,"total_tokens":` + itoa(prompt+tokens) +
		`,"prompt_tokens_details":{"cached_tokens":3}},"kv_transfer_params":null}`)
}

func newTestDecode(t *testing.T, body string) *chunked.Decode {
	t.Helper()
	plan, ok := chunked.PlanFor([]byte(body), 4)
	require.True(t, ok)
	return chunked.NewDecode(plan, []byte(body))
}

// next asks for the decode's next chunk and returns its body.
func next(t *testing.T, d *chunked.Decode) string {
	t.Helper()
	b, err := d.Next()
	require.NoError(t, err)
	return string(b)
}

// feed runs the decode's next chunk, answered with answer.
func feed(t *testing.T, d *chunked.Decode, answer []byte) {
	t.Helper()
	next(t, d)
	require.NoError(t, d.Add(answer))
}

// Chunk 1 is the body capped, not streamed; later chunks continue the ONE
// assistant message, without kv_transfer_params; the last asks only for
// what the budget has left; min_tokens is spread.
func TestChunkBodies(t *testing.T) {
	d := newTestDecode(t, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":10,"min_tokens":6,`+
		`"stream":true,"stream_options":{"include_usage":true},"kv_transfer_params":{"do_remote_prefill":true}}`)
	js := next(t, d)
	assert.Equal(t, 1, d.Chunks())
	assert.Equal(t, "false", gjson.Get(js, "stream").Raw)
	assert.False(t, gjson.Get(js, "stream_options").Exists())
	assert.EqualValues(t, 4, gjson.Get(js, "max_tokens").Int())
	assert.EqualValues(t, 4, gjson.Get(js, "max_completion_tokens").Int())
	assert.EqualValues(t, 4, gjson.Get(js, "min_tokens").Int())
	assert.True(t, gjson.Get(js, "kv_transfer_params").IsObject(), "chunk 1 carries the handoff")
	assert.False(t, gjson.Get(js, "continue_final_message").Exists())

	require.NoError(t, d.Add(chatAnswer(" ab cd", "length", 9, 4)))
	feed(t, d, chatAnswer(" ef \"g\"", "length", 13, 4))
	require.False(t, d.Ended())
	js = next(t, d)
	assert.False(t, gjson.Get(js, "kv_transfer_params").Exists())
	assert.Equal(t, "true", gjson.Get(js, "continue_final_message").Raw)
	assert.Equal(t, "false", gjson.Get(js, "add_generation_prompt").Raw)
	assert.EqualValues(t, 2, gjson.Get(js, "max_tokens").Int(), "the budget's rest")
	assert.EqualValues(t, 0, gjson.Get(js, "min_tokens").Int())
	m := gjson.Get(js, "messages").Array()
	require.Len(t, m, 2, "one assistant message, extended")
	assert.Equal(t, "assistant", m[1].Get("role").String())
	assert.Equal(t, ` ab cd ef "g"`, m[1].Get("content").String())

	require.NoError(t, d.Add(chatAnswer(" hi", "length", 17, 2)))
	assert.True(t, d.Ended(), "budget spent")
	assert.Equal(t, 10, d.Tokens())
	assert.Equal(t, "length", d.Finish())
	w := string(d.JSON())
	require.True(t, gjson.Valid(w), w)
	assert.Equal(t, ` ab cd ef "g" hi`, gjson.Get(w, "choices.0.message.content").String())
	assert.Equal(t, "length", gjson.Get(w, "choices.0.finish_reason").String())
	assert.EqualValues(t, 9, gjson.Get(w, "usage.prompt_tokens").Int(), "the first chunk's prompt")
	assert.EqualValues(t, 10, gjson.Get(w, "usage.completion_tokens").Int())
	assert.EqualValues(t, 19, gjson.Get(w, "usage.total_tokens").Int())
	assert.EqualValues(t, 3, gjson.Get(w, "usage.prompt_tokens_details.cached_tokens").Int())
}

// A chunk's body is the decode's body edited: a body that is no JSON
// object fails, and the chunk is not counted.
func TestChunkBodyNotAnObject(t *testing.T) {
	plan, ok := chunked.PlanFor([]byte(`{"messages":[]}`), 4)
	require.True(t, ok)
	d := chunked.NewDecode(plan, []byte(`[1]`))
	_, err := d.Next()
	require.Error(t, err)
	assert.Zero(t, d.Chunks())
}

func TestChunkEnds(t *testing.T) {
	body := `{"messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name   string
		answer []byte
		ended  bool
	}{
		{"length goes on", chatAnswer(" a b c d", "length", 5, 4), false},
		{"stop ends", chatAnswer(" a", "stop", 5, 2), true},
		{"tool_calls ends", chatAnswer("", "tool_calls", 5, 3), true},
		{"empty chunk ends", chatAnswer("", "length", 5, 0), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDecode(t, body)
			feed(t, d, tc.answer)
			assert.Equal(t, tc.ended, d.Ended())
		})
	}
	d := newTestDecode(t, body)
	for !d.Ended() {
		feed(t, d, chatAnswer(" a", "length", 5, 1))
	}
	assert.Equal(t, chunked.MaxChunks, d.Chunks(), "no budget: bounded by the chunk count")
	for _, bad := range []string{`not json`, `{"choices":[]}`, `{"id":"x"}`} {
		d := newTestDecode(t, body)
		next(t, d)
		assert.ErrorIs(t, d.Add([]byte(bad)), upstream.ErrBadUpstreamAnswer, bad)
	}
}

// events splits an event stream into its data, nil for [DONE].
func events(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var evs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n\n") {
		d := strings.TrimPrefix(line, "data: ")
		if d == "[DONE]" {
			evs = append(evs, nil)
			continue
		}
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(d), &v), d)
		evs = append(evs, v)
	}
	return evs
}

// The stream: role in the first delta, text deltas, finish_reason only at
// the end, the usage chunk only when asked for, [DONE].
func TestChunkEvents(t *testing.T) {
	for _, usage := range []bool{false, true} {
		d := newTestDecode(t, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`)
		feed(t, d, chatAnswer(" a b c d", "length", 5, 4))
		b := d.OpenEvent(nil)
		feed(t, d, chatAnswer(" e f", "stop", 9, 3))
		b = d.TextEvent(b)
		b = d.CloseEvents(b, usage)
		evs := events(t, b)
		n := 4
		if usage {
			n = 5
		}
		require.Len(t, evs, n)
		assert.Nil(t, evs[n-1], "[DONE] last")
		text := ""
		for i, e := range evs[:3] {
			assert.Equal(t, "chat.completion.chunk", e["object"])
			assert.Equal(t, "chatcmpl-1", e["id"])
			ch := e["choices"].([]any)[0].(map[string]any)
			d := ch["delta"].(map[string]any)
			if i == 0 {
				assert.Equal(t, "assistant", d["role"])
			} else {
				assert.NotContains(t, d, "role")
			}
			if s, ok := d["content"].(string); ok {
				text += s
			}
			if i < 2 {
				assert.Nil(t, ch["finish_reason"], "no intermediate finish_reason")
			} else {
				assert.Equal(t, "stop", ch["finish_reason"])
			}
		}
		assert.Equal(t, " a b c d e f", text)
		if usage {
			assert.Empty(t, evs[3]["choices"])
			assert.EqualValues(t, 7, evs[3]["usage"].(map[string]any)["completion_tokens"])
		}
	}
	d := newTestDecode(t, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`)
	feed(t, d, chatAnswer("", "length", 5, 1))
	assert.Empty(t, d.TextEvent(nil), "no text, no event")
}
