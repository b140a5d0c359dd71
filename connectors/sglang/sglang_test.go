package sglang_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/sglang"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

func TestLegs(t *testing.T) {
	pr := connectors.Pairing{PrefillHost: "10.0.0.9", Room: 1<<62 + 7}
	tests := []struct {
		name    string
		api     connectors.API
		body    string
		want    string
		wantErr error
	}{
		{"chat", connectors.APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9,"stream":true}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9,"stream":true,"bootstrap_host":"10.0.0.9","bootstrap_port":8998,"bootstrap_room":4611686018427387911}`, nil},
		{"generate keeps its caps", connectors.APIGenerate, `{"token_ids":[1,2],"sampling_params":{"max_tokens":5}}`,
			`{"token_ids":[1,2],"sampling_params":{"max_tokens":5},"bootstrap_host":"10.0.0.9","bootstrap_port":8998,"bootstrap_room":4611686018427387911}`, nil},
		{"client bootstrap fields are replaced", connectors.APICompletions, `{"prompt":"x","bootstrap_room":1}`,
			`{"prompt":"x","bootstrap_room":4611686018427387911,"bootstrap_host":"10.0.0.9","bootstrap_port":8998}`, nil},
		{"n above 1 refused", connectors.APICompletions, `{"prompt":"x","n":2}`, "", connectors.ErrUnsupportedRequest},
		{"generate n above 1 refused", connectors.APIGenerate, `{"token_ids":[1],"sampling_params":{"n":3}}`, "", connectors.ErrUnsupportedRequest},
		{"not an object", connectors.APIChat, `[1]`, "", connectors.ErrBadBody},
	}
	c := sglang.New(sglang.DefaultBootstrapPort)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre, dec, err := c.Legs(tt.api, []byte(tt.body), pr)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.JSONEq(t, tt.want, string(pre))
			assert.Equal(t, string(pre), string(dec), "one body for both legs")
		})
	}
	assert.Equal(t, connectors.ChoreographyConcurrent, connectors.ChoreographyOf(c))
}

// TestCorpusBootstrapHost: the bootstrap members as SGLang's mini_lb
// writes them (the corpus), an IPv6 prefill host bracketed.
func TestCorpusBootstrapHost(t *testing.T) {
	s, err := wirecorpus.Get("sglang-bootstrap-ipv6")
	require.NoError(t, err)
	want := gjson.GetBytes(s.Value, "bootstrap_host").Str
	require.Equal(t, "[fd00::1]", want)
	c := sglang.New(int(gjson.GetBytes(s.Value, "bootstrap_port").Int()))
	for _, host := range []string{"fd00::1", "[fd00::1]"} {
		pre, _, err := c.Legs(connectors.APIChat, []byte(`{"model":"m","messages":[]}`), connectors.Pairing{PrefillHost: host, Room: 5})
		require.NoError(t, err)
		assert.Equal(t, want, gjson.GetBytes(pre, "bootstrap_host").Str)
		assert.Equal(t, gjson.GetBytes(s.Value, "bootstrap_port").Raw, gjson.GetBytes(pre, "bootstrap_port").Raw)
	}
	pre, _, err := c.Legs(connectors.APIChat, []byte(`{"model":"m","messages":[]}`), connectors.Pairing{PrefillHost: "10.0.0.9", Room: 5})
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.9", gjson.GetBytes(pre, "bootstrap_host").Str, "IPv4 as it is")
}
