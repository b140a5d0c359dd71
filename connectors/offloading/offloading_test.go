package offloading_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/offloading"
)

func TestLegs(t *testing.T) {
	src := &connectors.P2PPeer{RequestID: "src-1", Host: "10.0.0.7", Port: 7778}
	const decParams = `"kv_transfer_params":{"remote_prefiller":{"kv_request_id":"req-1","remote_host":"10.0.0.9","remote_port":7777}}`
	tests := []struct {
		name      string
		api       connectors.API
		source    *connectors.P2PPeer
		body      string
		pre, dec  string
		wantError error
	}{
		{name: "completions", api: connectors.APICompletions,
			body: `{"prompt":"hi","max_tokens":9,"stream":true,"stream_options":{"include_usage":true},"min_tokens":2}`,
			pre:  `{"prompt":"hi","max_tokens":1,"stream":false,"kv_transfer_params":{"remote_decoder":{"kv_request_id":"req-1"}}}`,
			dec:  `{"prompt":"hi","max_tokens":9,"stream":true,"stream_options":{"include_usage":true},"min_tokens":2,` + decParams + `}`},
		{name: "chat caps both limits", api: connectors.APIChat,
			body: `{"messages":[],"max_completion_tokens":5}`,
			pre:  `{"messages":[],"max_completion_tokens":1,"stream":false,"max_tokens":1,"kv_transfer_params":{"remote_decoder":{"kv_request_id":"req-1"}}}`,
			dec:  `{"messages":[],"max_completion_tokens":5,` + decParams + `}`},
		{name: "responses", api: connectors.APIResponses,
			body: `{"input":"x","max_output_tokens":30}`,
			pre:  `{"input":"x","max_output_tokens":1,"stream":false,"kv_transfer_params":{"remote_decoder":{"kv_request_id":"req-1"}}}`,
			dec:  `{"input":"x","max_output_tokens":30,` + decParams + `}`},
		{name: "generate", api: connectors.APIGenerate,
			body: `{"token_ids":[1,2],"sampling_params":{"max_tokens":5,"min_tokens":2}}`,
			pre:  `{"token_ids":[1,2],"sampling_params":{"max_tokens":1},"stream":false,"kv_transfer_params":{"remote_decoder":{"kv_request_id":"req-1"}}}`,
			dec:  `{"token_ids":[1,2],"sampling_params":{"max_tokens":5,"min_tokens":2},` + decParams + `}`},
		{name: "a source goes on the prefill leg only", api: connectors.APICompletions, source: src,
			body: `{"prompt":"hi"}`,
			pre:  `{"prompt":"hi","max_tokens":1,"stream":false,"kv_transfer_params":{"remote_decoder":{"kv_request_id":"req-1"},"remote_kv_source":{"kv_request_id":"src-1","remote_host":"10.0.0.7","remote_port":7778}}}`,
			dec:  `{"prompt":"hi",` + decParams + `}`},
		{name: "trusted client params are replaced on both legs", api: connectors.APICompletions,
			body: `{"prompt":"hi","kv_transfer_params":{"remote_host":"10.6.6.6"}}`,
			pre:  `{"prompt":"hi","kv_transfer_params":{"remote_decoder":{"kv_request_id":"req-1"}},"max_tokens":1,"stream":false}`,
			dec:  `{"prompt":"hi",` + decParams + `}`},
		{name: "not an object", api: connectors.APIChat, body: `[1]`, wantError: connectors.ErrBadBody},
	}
	c := offloading.New()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pr := connectors.Pairing{PrefillHost: "10.0.0.9", KVRequestID: "req-1", PrefillP2PPort: 7777, Source: tt.source}
			pre, dec, err := c.Legs(tt.api, []byte(tt.body), pr)
			if tt.wantError != nil {
				require.ErrorIs(t, err, tt.wantError)
				return
			}
			require.NoError(t, err)
			assert.JSONEq(t, tt.pre, string(pre), "prefill leg")
			assert.JSONEq(t, tt.dec, string(dec), "decode leg")
		})
	}
	assert.Equal(t, connectors.ChoreographyConcurrent, connectors.ChoreographyOf(c))
	assert.Equal(t, "offloading", c.Name())
}
