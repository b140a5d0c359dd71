package mooncake_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/mooncake"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
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
			assert.Equal(t, "http://h:9000", b.URL)
			assert.Equal(t, tt.wantID, b.EngineID)
			assert.Equal(t, tt.wantRank, b.Rank)
			assert.Equal(t, connectors.RankEngine{Rank: tt.wantRank, EngineID: tt.wantID}, b.Ranks[0], "the lowest rank first")
		})
	}
}

// TestCorpusDataParallelPrefiller: with vLLM's bootstrap answer of two
// ranks (the corpus), each split's prefill leg names a rank and its decode
// leg carries that rank's engine id, and splits spread over both ranks.
func TestCorpusDataParallelPrefiller(t *testing.T) {
	s, err := wirecorpus.Get("vllm-mooncake-bootstrap-dp2")
	require.NoError(t, err)
	c := mooncake.New(8998)
	b, err := c.ParseBootstrap("10.0.0.5:8998", s.Value)
	require.NoError(t, err)
	require.Len(t, b.Ranks, 2)
	seen := map[string]int{}
	for i := range 64 {
		pr := connectors.Pairing{PrefillHost: "10.0.0.5", TransferID: fmt.Sprintf("xfer-%d", i), Bootstrap: b}
		rank := c.PrefillRank(pr)
		require.Contains(t, []string{"0", "1"}, rank)
		_, dec, err := c.Legs(connectors.APICompletions, []byte(`{"prompt":"x"}`), pr)
		require.NoError(t, err)
		want := gjson.GetBytes(s.Value, rank+".engine_id").Str
		assert.Equal(t, want, gjson.GetBytes(dec, "kv_transfer_params.remote_engine_id").Str, "the engine of the rank the prefill names")
		seen[rank]++
	}
	assert.Len(t, seen, 2, "both ranks get splits")
	one, err := c.ParseBootstrap("10.0.0.5:8998", []byte(`{"0":{"engine_id":"e0"}}`))
	require.NoError(t, err)
	assert.Empty(t, c.PrefillRank(connectors.Pairing{TransferID: "xfer-1", Bootstrap: one}), "one rank: no header")
}

// TestCorpusLegs: the legs carry the members vLLM's Mooncake proxy sends
// (the corpus' prefill and decode requests), no more, no fewer.
func TestCorpusLegs(t *testing.T) {
	c := mooncake.New(8998)
	b, err := c.ParseBootstrap("10.0.0.5:8998", []byte(`{"0":{"engine_id":"e0"}}`))
	require.NoError(t, err)
	pre, dec, err := c.Legs(connectors.APICompletions, []byte(`{"prompt":"x"}`), connectors.Pairing{PrefillHost: "10.0.0.5", TransferID: "xfer-1", Bootstrap: b})
	require.NoError(t, err)
	for leg, name := range map[string]string{string(pre): "vllm-mooncake-prefill-request", string(dec): "vllm-mooncake-decode-request"} {
		s, err := wirecorpus.Get(name)
		require.NoError(t, err)
		var got []string
		gjson.Get(leg, "kv_transfer_params").ForEach(func(k, _ gjson.Result) bool { got = append(got, k.Str); return true })
		assert.ElementsMatch(t, s.Members(), got, name)
	}
}
