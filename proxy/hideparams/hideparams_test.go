package hideparams_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/hideparams"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

func TestHide(t *testing.T) {
	const p = `{"remote_host":"10.0.0.9","remote_port":5600,"remote_engine_id":"d","remote_block_ids":[[1,2]]}`
	for _, tc := range []struct{ name, in, want string }{
		{"no params", `{"choices":[{"text":" hi"}]}`, `{"choices":[{"text":" hi"}]}`},
		{"null params", `{"choices":[],"kv_transfer_params":null}`, `{"choices":[],"kv_transfer_params":null}`},
		{"params", `{"choices":[],"kv_transfer_params":` + p + `}`, `{"choices":[],"kv_transfer_params":null}`},
		{"null, then params", `{"kv_transfer_params":null,"choices":[],"kv_transfer_params":` + p + `}`, `{"kv_transfer_params":null,"choices":[],"kv_transfer_params":null}`},
		{"escaped name", `{"kv\u005ftransfer_params":` + p + `}`, `{"kv\u005ftransfer_params":null}`},
		{"escaped first letter", `{"\u006bv_transfer_params":` + p + `}`, `{"\u006bv_transfer_params":null}`},
		{"nested in a Responses API event", `{"type":"response.completed","response":{"kv_transfer_params":` + p + `}}`, `{"type":"response.completed","response":{"kv_transfer_params":null}}`},
		{"non-ASCII escapes, no name", `{"text":"caf\u00e9 \u4e2d"}`, `{"text":"caf\u00e9 \u4e2d"}`},
		{"the name in the text", `{"text":"kv_transfer_params"}`, `{"text":"kv_transfer_params"}`},
		{"an SSE line cut at the member (a multi-line event)", `{"choices":[],"kv_transfer_params":`, `null`},
		{"a bare CR hiding a second data line", "{\"a\":1}\rdata: {\"kv_transfer_params\":" + p + "}", `null`},
		{"not JSON, no name", `[DONE]`, `[DONE]`},
		{"a scalar with an escaped ASCII letter: no member", `x\u0061`, `x\u0061`},
		{"a second value, its name escaped", `{"a":1} {"kv\u005ftransfer_params":1}`, `null`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, string(hideparams.Hide([]byte(tc.in))))
		})
	}
}

// TestEveryRequest: the feature takes part in every request, a refused
// prefiller's fallback too, and edits split and local answers alike.
func TestEveryRequest(t *testing.T) {
	const in = `{"kv_transfer_params":{"remote_port":1}}`
	for _, r := range []feature.Request{{}, {Prefiller: "p:1", Session: "s"}, {Refused: true}} {
		u := hideparams.Feature{}.Begin(r, nil)
		assert.Equal(t, `{"kv_transfer_params":null}`, string(u.(feature.AnswerEditor).AnswerEdit()([]byte(in))))
		assert.Equal(t, `{"kv_transfer_params":null}`, string(u.(feature.LocalAnswerEditor).LocalAnswerEdit()([]byte(in))))
	}
}

func BenchmarkHideNoParams(b *testing.B) {
	ev := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" the next few words\n of the answer"},"logprobs":null,"finish_reason":null}]}`)
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		hideparams.Hide(ev)
	}
}

// TestHideCorpusAnswers: every answer of the upstream corpus that carries
// kv_transfer_params (vLLM's prefill and decode answers of each NIXL
// generation, llm-d-inference-sim's, vllm-ascend's) reaches the client
// with them null, whole answer and stream event alike.
func TestHideCorpusAnswers(t *testing.T) {
	all, err := wirecorpus.All()
	require.NoError(t, err)
	n := 0
	for _, s := range all {
		if s.Container != hideparams.Member || (s.Message != wirecorpus.PrefillAnswer && s.Message != wirecorpus.DecodeAnswer) {
			continue
		}
		n++
		for _, extra := range []string{
			`"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}]`,
			`"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"length"}]`,
		} {
			in := s.Body(extra)
			require.True(t, gjson.GetBytes(in, hideparams.Member).IsObject(), s.Name)
			out := hideparams.Hide(in)
			assert.Equal(t, "null", gjson.GetBytes(out, hideparams.Member).Raw, "%s: %s", s.Name, out)
			assert.Equal(t, "x", gjson.GetBytes(out, "choices.0.message.content").String()+gjson.GetBytes(out, "choices.0.delta.content").String(), s.Name)
		}
	}
	assert.GreaterOrEqual(t, n, 5, "the corpus's answers with params")
}
