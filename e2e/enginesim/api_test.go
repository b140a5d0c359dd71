package enginesim

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// apiCase is one inference API with a body and where its text is.
type apiCase struct {
	name, path, body string
	text             func(map[string]any) string
}

func apiCases() []apiCase {
	return []apiCase{
		{"completions", "/v1/completions", `{"model":"sim-model","prompt":"tell me a story","max_tokens":4}`,
			func(m map[string]any) string { s, _ := get(m, "choices", 0, "text").(string); return s }},
		{"chat", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"tell me a story"}],"max_completion_tokens":4,"max_tokens":9}`,
			func(m map[string]any) string { s, _ := get(m, "choices", 0, "message", "content").(string); return s }},
		{"responses", "/v1/responses", `{"model":"sim-model","input":"tell me a story","max_output_tokens":4}`,
			func(m map[string]any) string { s, _ := get(m, "output", 0, "content", 0, "text").(string); return s }},
		{"messages", "/v1/messages", `{"model":"sim-model","messages":[{"role":"user","content":[{"type":"text","text":"tell me a story"}]}],"max_tokens":4}`,
			func(m map[string]any) string { s, _ := get(m, "content", 0, "text").(string); return s }},
		{"generate", "/inference/v1/generate", `{"model":"sim-model","token_ids":[101,202,303,404],"sampling_params":{"max_tokens":4}}`,
			func(m map[string]any) string {
				ids, _ := get(m, "choices", 0, "token_ids").([]any)
				var b strings.Builder
				for _, id := range ids {
					b.WriteString(Word(int(id.(float64))))
				}
				return b.String()
			}},
	}
}

func TestAPIsJSONHonourTokenCaps(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	for _, tc := range apiCases() {
		t.Run(tc.name, func(t *testing.T) {
			a := post(t, s.url+tc.path, tc.body)
			require.Equal(t, http.StatusOK, a.status, "%s", a.body)
			text := tc.text(a.json)
			assert.Len(t, strings.Fields(text), 4, "the per-API token cap (smallest of the caps given) applies: %q", text)
			again := post(t, s.url+tc.path, tc.body)
			assert.Equal(t, text, tc.text(again.json), "deterministic")
		})
	}
}

func TestChatAndCompletionsUsage(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	prompt := longPrompt(40) // 40 tokens: 2 full blocks of 16 and a partial one
	body := `{"model":"sim-model","prompt":` + mustJSON(prompt) + `,"max_tokens":3}`
	first := post(t, s.url+"/v1/completions", body)
	require.Equal(t, 200, first.status)
	assert.EqualValues(t, 40, get(first.json, "usage", "prompt_tokens"))
	assert.EqualValues(t, 3, get(first.json, "usage", "completion_tokens"))
	assert.EqualValues(t, 0, get(first.json, "usage", "prompt_tokens_details", "cached_tokens"))
	assert.Nil(t, get(first.json, "kv_transfer_params"))
	assert.Equal(t, "length", get(first.json, "choices", 0, "finish_reason"))

	second := post(t, s.url+"/v1/completions", body)
	assert.EqualValues(t, 32, get(second.json, "usage", "prompt_tokens_details", "cached_tokens"), "the two full blocks are a prefix-cache hit")
	assert.Equal(t, get(first.json, "choices", 0, "text"), get(second.json, "choices", 0, "text"))
	assert.Equal(t, 80.0, s.metric(t, "vllm:prefix_cache_queries_total"))
	assert.Equal(t, 32.0, s.metric(t, "vllm:prefix_cache_hits_total"))
	assert.Equal(t, 80.0, s.metric(t, "vllm:prompt_tokens_total"))
	assert.Equal(t, 6.0, s.metric(t, "vllm:generation_tokens_total"))
	assert.Equal(t, 2.0, s.metric(t, "vllm:time_to_first_token_seconds"))
}

func TestRequestIDHeaderIsUsed(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	a := post(t, s.url+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`, "X-Request-Id", "abc-123")
	assert.Equal(t, "chatcmpl-abc-123", get(a.json, "id"))
	assert.Len(t, strings.Fields(get(a.json, "choices", 0, "message", "content").(string)), 16, "default max tokens")
}

func TestStreamingShapes(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	t.Run("chat role chunk first, usage, DONE", func(t *testing.T) {
		status, evs, err := stream(t, s.url+"/v1/chat/completions",
			`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`)
		require.NoError(t, err)
		require.Equal(t, 200, status)
		require.Len(t, evs, 6) // role, 3 tokens, usage, [DONE]
		assert.Equal(t, map[string]any{"role": "assistant", "content": ""}, get(evs[0].obj(t), "choices", 0, "delta"))
		assert.Nil(t, get(evs[1].obj(t), "choices", 0, "finish_reason"))
		assert.Equal(t, "length", get(evs[3].obj(t), "choices", 0, "finish_reason"))
		assert.EqualValues(t, 3, get(evs[4].obj(t), "usage", "completion_tokens"))
		assert.Equal(t, "[DONE]", evs[5].data)
		var text string
		for _, e := range evs[1:4] {
			text += get(e.obj(t), "choices", 0, "delta", "content").(string)
		}
		j := post(t, s.url+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`)
		assert.Equal(t, get(j.json, "choices", 0, "message", "content"), text, "streamed text equals the JSON answer")
	})
	t.Run("completions without usage", func(t *testing.T) {
		_, evs, err := stream(t, s.url+"/v1/completions", `{"model":"sim-model","prompt":"hi","max_tokens":2,"stream":true}`)
		require.NoError(t, err)
		require.Len(t, evs, 3)
		assert.Equal(t, "[DONE]", evs[2].data)
	})
	t.Run("responses events", func(t *testing.T) {
		_, evs, err := stream(t, s.url+"/v1/responses", `{"model":"sim-model","input":"hi","max_output_tokens":2,"stream":true}`)
		require.NoError(t, err)
		var names []string
		for _, e := range evs {
			names = append(names, e.name)
		}
		assert.Equal(t, []string{"response.created", "response.output_text.delta", "response.output_text.delta", "response.completed"}, names)
		assert.Equal(t, "incomplete", get(evs[3].obj(t), "response", "status"))
	})
	t.Run("messages events", func(t *testing.T) {
		_, evs, err := stream(t, s.url+"/v1/messages", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`)
		require.NoError(t, err)
		var names []string
		for _, e := range evs {
			names = append(names, e.name)
		}
		assert.Equal(t, []string{"message_start", "content_block_start", "content_block_delta", "content_block_delta",
			"content_block_stop", "message_delta", "message_stop"}, names)
		assert.Equal(t, "max_tokens", get(evs[5].obj(t), "delta", "stop_reason"))
	})
}

func TestBadInput(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	tests := []struct {
		name, path, body string
		status           int
		typ, param       string
	}{
		{"malformed JSON", "/v1/completions", `{"model":`, 400, "BadRequestError", ""},
		{"not an object", "/v1/completions", `[1,2]`, 400, "BadRequestError", ""},
		{"missing model", "/v1/completions", `{"prompt":"x"}`, 400, "BadRequestError", "model"},
		{"model wrong type", "/v1/completions", `{"model":7,"prompt":"x"}`, 400, "BadRequestError", "model"},
		{"missing prompt", "/v1/completions", `{"model":"sim-model"}`, 400, "BadRequestError", "prompt"},
		{"prompt wrong type", "/v1/completions", `{"model":"sim-model","prompt":{"a":1}}`, 400, "BadRequestError", "prompt"},
		{"empty prompt", "/v1/completions", `{"model":"sim-model","prompt":""}`, 400, "BadRequestError", "prompt"},
		{"max_tokens wrong type", "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":"many"}`, 400, "BadRequestError", "max_tokens"},
		{"max_tokens zero", "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":0}`, 400, "BadRequestError", "max_tokens"},
		{"stream wrong type", "/v1/completions", `{"model":"sim-model","prompt":"x","stream":"yes"}`, 400, "BadRequestError", "stream"},
		{"min above max", "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2,"min_tokens":5}`, 400, "BadRequestError", "min_tokens"},
		{"messages missing", "/v1/chat/completions", `{"model":"sim-model"}`, 400, "BadRequestError", "messages"},
		{"messages wrong type", "/v1/chat/completions", `{"model":"sim-model","messages":"hi"}`, 400, "BadRequestError", "messages"},
		{"message without role", "/v1/chat/completions", `{"model":"sim-model","messages":[{"content":"hi"}]}`, 400, "BadRequestError", "messages"},
		{"responses without input", "/v1/responses", `{"model":"sim-model"}`, 400, "BadRequestError", "input"},
		{"generate token_ids wrong type", "/inference/v1/generate", `{"token_ids":"abc"}`, 400, "BadRequestError", "token_ids"},
		{"n above 1", "/v1/completions", `{"model":"sim-model","prompt":"x","n":2}`, 400, "BadRequestError", "n"},
		{"unknown model", "/v1/completions", `{"model":"other","prompt":"x"}`, 404, "NotFoundError", "model"},
		{"unknown path", "/v1/nothing", `{}`, 404, "NotFoundError", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := post(t, s.url+tc.path, tc.body)
			require.Equal(t, tc.status, a.status, "%s", a.body)
			require.NotNil(t, a.json, "an OpenAI-style JSON error: %s", a.body)
			assert.Equal(t, tc.typ, get(a.json, "error", "type"))
			assert.EqualValues(t, tc.status, get(a.json, "error", "code"))
			assert.NotEmpty(t, get(a.json, "error", "message"))
			if tc.param != "" {
				assert.Equal(t, tc.param, get(a.json, "error", "param"))
			}
		})
	}
	a := post(t, s.url+"/v1/completions", `{"model":"sim-model","prompt":"still alive","max_tokens":1}`)
	assert.Equal(t, 200, a.status, "the engine keeps serving after bad input")
}

func TestModelsAndHealth(t *testing.T) {
	s := startSim(t, RoleDecode, nil)
	resp, err := http.Get(s.url + "/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	h, err := http.Get(s.url + "/health")
	require.NoError(t, err)
	h.Body.Close()
	assert.Equal(t, 200, h.StatusCode)
}

func TestTokenChunkMatchesGenericRendering(t *testing.T) {
	for _, a := range []api{apiCompletions, apiChat} {
		for _, fin := range []string{"", "length"} {
			o := &output{api: a, id: `id-"quoted"`, model: "m", created: 42, tokens: []int{FirstTextToken + 7}}
			var finish any
			if fin != "" {
				finish = fin
			}
			var want map[string]any
			if a == apiChat {
				want = chatChunk(o, map[string]any{"content": Word(o.tokens[0])}, finish)
			} else {
				want = map[string]any{
					"id": o.id, "object": "text_completion", "created": o.created, "model": o.model,
					"choices": []any{map[string]any{"index": 0, "text": Word(o.tokens[0]), "logprobs": nil, "finish_reason": finish, "stop_reason": nil}},
				}
			}
			assert.JSONEq(t, mustJSON(want), string(streamToken(o, 0, fin).data))
		}
	}
}
