package connectors_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

func TestAPIForPath(t *testing.T) {
	for _, p := range []string{"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/inference/v1/generate"} {
		api, ok := connectors.APIForPath(p)
		require.True(t, ok, p)
		assert.Equal(t, p, api.String())
	}
	_, ok := connectors.APIForPath("/v1/models")
	assert.False(t, ok)
}

func TestClassifyEvent(t *testing.T) {
	tests := []struct {
		name string
		api  connectors.API
		data string
		want connectors.EventKind
	}{
		{"chat role chunk", connectors.APIChat, `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, connectors.EventPreamble},
		{"chat content", connectors.APIChat, `{"choices":[{"index":0,"delta":{"content":"a"}}]}`, connectors.EventContent},
		{"chat role with content", connectors.APIChat, `{"choices":[{"index":0,"delta":{"role":"assistant","content":"a"}}]}`, connectors.EventContent},
		{"error", connectors.APIChat, `{"error":{"message":"Internal server error","code":500}}`, connectors.EventError},
		{"anthropic error", connectors.APIMessages, `{"type":"error","error":{}}`, connectors.EventError},
		{"done", connectors.APICompletions, ` [DONE]`, connectors.EventDone},
		{"completion text", connectors.APICompletions, `{"choices":[{"text":"a"}]}`, connectors.EventContent},
		{"responses created", connectors.APIResponses, `{"type":"response.created"}`, connectors.EventPreamble},
		{"messages start", connectors.APIMessages, `{"type":"message_start"}`, connectors.EventPreamble},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, connectors.ClassifyEvent(tt.api, []byte(tt.data)))
		})
	}
}

func TestAnswerAsSSE(t *testing.T) {
	chat := `{"id":"c1","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	out, ok := connectors.AnswerAsSSE(nil, connectors.APIChat, []byte(chat), true)
	require.True(t, ok)
	want := `data: {"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}` + "\n\n" +
		"data: [DONE]\n\n"
	assert.Equal(t, want, string(out))

	cmpl := `{"id":"c2","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":"y","finish_reason":"stop"}]}`
	out, ok = connectors.AnswerAsSSE(nil, connectors.APICompletions, []byte(cmpl), false)
	require.True(t, ok)
	assert.Equal(t, `data: {"id":"c2","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"logprobs":null,"text":"y","finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n", string(out))

	_, ok = connectors.AnswerAsSSE(nil, connectors.APIMessages, []byte(`{}`), false)
	assert.False(t, ok)
}

func TestFinished(t *testing.T) {
	stop, length := connectors.Finished(connectors.APIResponses, []byte(`{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}`))
	assert.False(t, stop)
	assert.True(t, length)
	stop, _ = connectors.Finished(connectors.APIGenerate, []byte(`{"choices":[{"finish_reason":"stop"}]}`))
	assert.True(t, stop)
}
