package nixlv2_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
)

func TestReleaseBody(t *testing.T) {
	params := `{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r-1","remote_block_ids":[[3,4]],"remote_host":"10.0.0.1","remote_port":5600}`
	kv := `"kv_transfer_params":` + params
	tests := []struct {
		name string
		api  connectors.API
		in   string
		want string
	}{
		{
			name: "completions streamed",
			api:  connectors.APICompletions,
			in:   `{"model":"m","prompt":"hi","max_tokens":50,"stream":true,"stream_options":{"include_usage":true}}`,
			want: `{"model":"m","prompt":"hi","max_tokens":1,"stream":false,` + kv + `}`,
		},
		{
			name: "completions not streamed, no cap",
			api:  connectors.APICompletions,
			in:   `{"model":"m","prompt":"hi"}`,
			want: `{"model":"m","prompt":"hi",` + kv + `,"stream":false,"max_tokens":1}`,
		},
		{
			name: "completions min_tokens removed",
			api:  connectors.APICompletions,
			in:   `{"model":"m","prompt":"hi","max_tokens":50,"min_tokens":10,"stream":false}`,
			want: `{"model":"m","prompt":"hi","max_tokens":1,"stream":false,` + kv + `}`,
		},
		{
			name: "chat streamed with stream_options",
			api:  connectors.APIChat,
			in:   `{"model":"m","messages":[{"role":"user","content":"a \"q\""}],"max_tokens":9,"stream":true,"stream_options":{"include_usage":true}}`,
			want: `{"model":"m","messages":[{"role":"user","content":"a \"q\""}],"max_tokens":1,"stream":false,` + kv + `}`,
		},
		{
			name: "chat with max_completion_tokens",
			api:  connectors.APIChat,
			in:   `{"model":"m","messages":[],"max_completion_tokens":9,"min_completion_tokens":2,"stream":true}`,
			want: `{"model":"m","messages":[],"max_completion_tokens":1,"stream":false,` + kv + `,"max_tokens":1}`,
		},
		{
			name: "chat without any cap: max_tokens only",
			api:  connectors.APIChat,
			in:   `{"model":"m","messages":[]}`,
			want: `{"model":"m","messages":[],` + kv + `,"stream":false,"max_tokens":1}`,
		},
		{
			name: "responses",
			api:  connectors.APIResponses,
			in:   `{"model":"m","input":"hi","max_output_tokens":30,"stream":true}`,
			want: `{"model":"m","input":"hi","max_output_tokens":1,"stream":false,` + kv + `}`,
		},
		{
			name: "messages",
			api:  connectors.APIMessages,
			in:   `{"model":"m","max_tokens":64,"messages":[],"stream":true}`,
			want: `{"model":"m","max_tokens":1,"messages":[],"stream":false,` + kv + `}`,
		},
		{
			name: "generate",
			api:  connectors.APIGenerate,
			in:   `{"token_ids":[1,2],"sampling_params":{"max_tokens":20,"min_tokens":3}}`,
			want: `{"token_ids":[1,2],"sampling_params":{"max_tokens":1},` + kv + `,"stream":false}`,
		},
		{
			name: "client kv params replaced",
			api:  connectors.APICompletions,
			in:   `{"prompt":"x","kv_transfer_params":{"evil":1},"max_tokens":3}`,
			want: `{"prompt":"x",` + kv + `,"max_tokens":1,"stream":false}`,
		},
	}
	c := nixlv2.New()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := connectors.Handoff{Params: []byte(params)}
			got, err := c.ReleaseBody([]byte("garbage"), tc.api, []byte(tc.in), h)
			require.NoError(t, err)
			assert.JSONEq(t, tc.want, string(got))
			assert.Equal(t, tc.want, string(got), "member order")
			assert.True(t, gjson.ValidBytes(got))
			// The release leg carries exactly what the decode leg would.
			dec, err := c.DecodeBody(nil, tc.api, []byte(tc.in), h)
			require.NoError(t, err)
			assert.Equal(t, gjson.GetBytes(dec, "kv_transfer_params").Raw, gjson.GetBytes(got, "kv_transfer_params").Raw)
		})
	}
	_, err := c.ReleaseBody(nil, connectors.APICompletions, []byte(`[1]`), connectors.Handoff{Params: []byte(params)})
	assert.ErrorIs(t, err, connectors.ErrBadBody)
}
