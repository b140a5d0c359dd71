package nixlv2_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
)

const prefillKV = `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

func TestPrefillBody(t *testing.T) {
	tests := []struct {
		name string
		api  connectors.API
		in   string
		want string
	}{
		{
			name: "completions",
			api:  connectors.APICompletions,
			in:   `{"model":"m","prompt":"hi","max_tokens":50,"min_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
			want: `{"model":"m","prompt":"hi","max_tokens":1,"stream":false,` + prefillKV + `}`,
		},
		{
			name: "chat",
			api:  connectors.APIChat,
			in:   `{"model":"m","messages":[{"role":"user","content":"a \"q\" {x}"}],"max_completion_tokens":9,"min_completion_tokens":2}`,
			want: `{"model":"m","messages":[{"role":"user","content":"a \"q\" {x}"}],"max_completion_tokens":1,"stream":false,` + prefillKV + `,"max_tokens":1}`,
		},
		{
			name: "responses",
			api:  connectors.APIResponses,
			in:   `{"model":"m","input":"hi","max_output_tokens":30,"stream":true}`,
			want: `{"model":"m","input":"hi","max_output_tokens":1,"stream":false,` + prefillKV + `}`,
		},
		{
			name: "messages",
			api:  connectors.APIMessages,
			in:   `{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"hi"}],"stream":true}`,
			want: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"stream":false,` + prefillKV + `}`,
		},
		{
			name: "generate",
			api:  connectors.APIGenerate,
			in:   `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":20,"min_tokens":3,"temperature":0},"stream":true}`,
			want: `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":1,"temperature":0},"stream":false,` + prefillKV + `}`,
		},
		{
			name: "client kv params are replaced",
			api:  connectors.APICompletions,
			in:   `{"prompt":"x","kv_transfer_params":{"evil":1}}`,
			want: `{"prompt":"x",` + prefillKV + `,"stream":false,"max_tokens":1}`,
		},
		{
			name: "blanks kept",
			api:  connectors.APICompletions,
			in:   "{ \"prompt\" : \"x\" ,\n \"max_tokens\": 7 }",
			want: `{ "prompt" : "x","max_tokens":1,"stream":false,` + prefillKV + `}`,
		},
	}
	c := nixlv2.New()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.in)
			out, err := c.PrefillBody(nil, tt.api, in)
			require.NoError(t, err)
			assert.JSONEq(t, tt.want, string(out))
			assert.Equal(t, tt.in, string(in), "client body must not change")
		})
	}
}

func TestPrefillBodyRejectsNonObject(t *testing.T) {
	for _, in := range []string{``, `[]`, `"x"`, `null`} {
		_, err := nixlv2.New().PrefillBody(nil, connectors.APIChat, []byte(in))
		assert.ErrorIs(t, err, connectors.ErrBadBody, in)
	}
}

const goodParams = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[12,13]],"remote_engine_id":"e1","remote_request_id":"r1","remote_host":"10.0.0.9","remote_port":5600,"tp_size":2}`

func TestParsePrefill(t *testing.T) {
	tests := []struct {
		name    string
		api     connectors.API
		answer  string
		want    connectors.Handoff
		wantErr error
	}{
		{
			name:   "length with params",
			api:    connectors.APICompletions,
			answer: `{"choices":[{"text":"a","finish_reason":"length"}],"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":16}},"kv_transfer_params":` + goodParams + `}`,
			want: connectors.Handoff{Params: []byte(goodParams), TPSize: 2, CachedTokens: 16,
				Addrs: []connectors.Addr{{Field: "kv_transfer_params.remote_host", Host: "10.0.0.9", Port: 5600}}},
		},
		{
			name:   "flat block ids",
			api:    connectors.APIChat,
			answer: `{"choices":[{"finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"h","remote_port":1}}`,
			want: connectors.Handoff{Params: []byte(`{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"h","remote_port":1}`),
				Addrs: []connectors.Addr{{Field: "kv_transfer_params.remote_host", Host: "h", Port: 1}}},
		},
		{
			name:   "eos on first token",
			api:    connectors.APIChat,
			answer: `{"choices":[{"message":{"content":""},"finish_reason":"stop"}],"kv_transfer_params":null}`,
			want:   connectors.Handoff{Done: true},
		},
		{
			name:   "messages end_turn",
			api:    connectors.APIMessages,
			answer: `{"stop_reason":"end_turn","usage":{"cache_read_input_tokens":3}}`,
			want:   connectors.Handoff{Done: true, CachedTokens: 3},
		},
		{
			name:    "length without params",
			api:     connectors.APICompletions,
			answer:  `{"choices":[{"finish_reason":"length"}]}`,
			wantErr: connectors.ErrNoKVParams,
		},
		{
			name:    "missing engine id",
			api:     connectors.APICompletions,
			answer:  `{"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1],"remote_host":"h","remote_port":1}}`,
			wantErr: connectors.ErrInvalidKVParams,
		},
		{
			name:    "params not an object",
			api:     connectors.APICompletions,
			answer:  `{"kv_transfer_params":[1]}`,
			wantErr: connectors.ErrInvalidKVParams,
		},
		{
			name:    "not json",
			api:     connectors.APICompletions,
			answer:  `Internal Server Error`,
			wantErr: connectors.ErrBadPrefillAnswer,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := nixlv2.New().ParsePrefill(tt.api, []byte(tt.answer))
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, h)
		})
	}
}

func TestDecodeBody(t *testing.T) {
	in := `{"model":"m","prompt":"hi","max_tokens":50,"min_tokens":5,"stream":true,"stream_options":{"include_usage":true},"kv_transfer_params":{"old":1}}`
	want := `{"model":"m","prompt":"hi","max_tokens":50,"min_tokens":5,"stream":true,"stream_options":{"include_usage":true},"kv_transfer_params":` + goodParams + `}`
	out, err := nixlv2.New().DecodeBody(nil, connectors.APICompletions, []byte(in), connectors.Handoff{Params: []byte(goodParams)})
	require.NoError(t, err)
	assert.Equal(t, want, string(out), "params copied verbatim, all else untouched")
}

func TestRewriteAnswer(t *testing.T) {
	h := connectors.Handoff{CachedTokens: 7}
	tests := []struct {
		name, in, want string
		api            connectors.API
	}{
		{"json", `{"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":40}}}`, `{"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":7}}}`, connectors.APIChat},
		{"chunk without usage", `{"choices":[{"delta":{"content":"cached_tokens"}}]}`, `{"choices":[{"delta":{"content":"cached_tokens"}}]}`, connectors.APIChat},
		{"responses completed event", `{"type":"response.completed","response":{"usage":{"input_tokens_details":{"cached_tokens":40}}}}`, `{"type":"response.completed","response":{"usage":{"input_tokens_details":{"cached_tokens":7}}}}`, connectors.APIResponses},
		{"messages start event", `{"type":"message_start","message":{"usage":{"cache_read_input_tokens":40}}}`, `{"type":"message_start","message":{"usage":{"cache_read_input_tokens":7}}}`, connectors.APIMessages},
		{"no usage", `{"id":"x"}`, `{"id":"x"}`, connectors.APICompletions},
		{"every other byte kept", `{"usage": {"prompt_tokens_details": { "cached_tokens" : 40 , "x":1}}, "tail":"cached_tokens"}`,
			`{"usage": {"prompt_tokens_details": { "cached_tokens" : 7 , "x":1}}, "tail":"cached_tokens"}`, connectors.APIChat},
		{"nested, spaced", `{"type":"response.completed", "response": {"id":"r","usage":{"input_tokens_details":{"cached_tokens":1234}}}}`,
			`{"type":"response.completed", "response": {"id":"r","usage":{"input_tokens_details":{"cached_tokens":7}}}}`, connectors.APIResponses},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, string(nixlv2.New().RewriteAnswer(tt.api, []byte(tt.in), h)))
		})
	}
}
