package mooncake_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/mooncake"
)

func TestLegs(t *testing.T) {
	pr := connectors.Pairing{PrefillHost: "10.0.0.9", TransferID: "xfer-1",
		Bootstrap: connectors.Bootstrap{URL: "http://10.0.0.9:8998", EngineID: "e-1"}}
	const pp = `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":"xfer-1"}`
	const dp = `"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"transfer_id":"xfer-1","remote_bootstrap_addr":"http://10.0.0.9:8998","remote_engine_id":"e-1"}`
	tests := []struct {
		name               string
		api                connectors.API
		body, wantP, wantD string
	}{
		{"completions", connectors.APICompletions, `{"prompt":"x","max_tokens":9,"min_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`,
			`{"prompt":"x","max_tokens":1,"stream":false,` + pp + `}`,
			`{"prompt":"x","max_tokens":9,"min_tokens":2,"stream":true,"stream_options":{"include_usage":true},` + dp + `}`},
		{"chat", connectors.APIChat, `{"messages":[],"max_completion_tokens":9}`,
			`{"messages":[],"max_completion_tokens":1,"stream":false,"max_tokens":1,` + pp + `}`,
			`{"messages":[],"max_completion_tokens":9,` + dp + `}`},
		{"responses", connectors.APIResponses, `{"input":"x","max_output_tokens":9}`,
			`{"input":"x","max_output_tokens":1,"stream":false,` + pp + `}`, `{"input":"x","max_output_tokens":9,` + dp + `}`},
		{"generate", connectors.APIGenerate, `{"token_ids":[1],"sampling_params":{"max_tokens":9,"min_tokens":3}}`,
			`{"token_ids":[1],"sampling_params":{"max_tokens":1},"stream":false,` + pp + `}`,
			`{"token_ids":[1],"sampling_params":{"max_tokens":9,"min_tokens":3},` + dp + `}`},
	}
	c := mooncake.New(mooncake.DefaultBootstrapPort)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre, dec, err := c.Legs(tt.api, []byte(tt.body), pr)
			require.NoError(t, err)
			assert.JSONEq(t, tt.wantP, string(pre))
			assert.JSONEq(t, tt.wantD, string(dec))
		})
	}
}

func TestParseBootstrap(t *testing.T) {
	c := mooncake.New(9000)
	assert.Equal(t, "10.0.0.9:9000", c.BootstrapAddr("10.0.0.9"))
	assert.Equal(t, "/query", c.BootstrapPath())
	tests := []struct {
		name, answer, wantID, wantRank string
		wantErr                        bool
	}{
		{"one rank", `{"0":{"engine_id":"e0","kv_port":1}}`, "e0", "0", false},
		{"lowest rank", `{"10":{"engine_id":"e10"},"2":{"engine_id":"e2"}}`, "e2", "2", false},
		{"no engine id", `{"0":{"kv_port":1}}`, "", "", true},
		{"not an object", `[]`, "", "", true},
		{"malformed", `{"0":{"engine_id":"e0"}`, "", "", true},
		{"engine id with a control character", `{"0":{"engine_id":"e\u0000"}}`, "", "", true},
		{"engine id with a quote", `{"0":{"engine_id":"e\",\"remote_host\":\"10.9.9.9"}}`, "", "", true},
		{"engine id too long", `{"0":{"engine_id":"` + strings.Repeat("e", 257) + `"}}`, "", "", true},
		{"engine id not a string", `{"0":{"engine_id":7}}`, "", "", true},
		{"rank not a number", `{"zero":{"engine_id":"e0"}}`, "", "", true},
		{"other members ignored", `{"0":{"engine_id":"e0","remote_bootstrap_addr":"http://10.9.9.9:1","kv_host":"10.9.9.9"}}`, "e0", "0", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := c.ParseBootstrap("h:9000", []byte(tt.answer))
			if tt.wantErr {
				require.ErrorIs(t, err, connectors.ErrBadBootstrap)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, connectors.Bootstrap{URL: "http://h:9000", EngineID: tt.wantID, Rank: tt.wantRank}, b)
		})
	}
}
