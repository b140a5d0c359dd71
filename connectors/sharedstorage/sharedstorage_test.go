package sharedstorage_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/sharedstorage"
)

func TestBodies(t *testing.T) {
	c := sharedstorage.New()
	tests := []struct {
		name                          string
		api                           connectors.API
		body, wantPrefill, wantDecode string
		decodeFirst                   bool
	}{
		{"chat with threshold", connectors.APIChat, `{"messages":[],"stream":true,"cache_hit_threshold":0.5}`,
			`{"messages":[],"stream":false,"cache_hit_threshold":0,"max_tokens":1,"max_completion_tokens":1}`,
			`{"messages":[],"stream":true,"cache_hit_threshold":0}`, true},
		{"completions without threshold", connectors.APICompletions, `{"prompt":"x","max_tokens":9}`,
			`{"prompt":"x","max_tokens":1,"stream":false}`, `{"prompt":"x","max_tokens":9}`, false},
		{"messages", connectors.APIMessages, `{"messages":[],"max_tokens":9,"cache_hit_threshold":0.9}`,
			`{"messages":[],"max_tokens":1,"cache_hit_threshold":0,"stream":false}`,
			`{"messages":[],"max_tokens":9,"cache_hit_threshold":0}`, true},
		{"null threshold is none", connectors.APIResponses, `{"input":"x","cache_hit_threshold":null}`,
			`{"input":"x","cache_hit_threshold":null,"stream":false,"max_output_tokens":1}`,
			`{"input":"x","cache_hit_threshold":null}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pre, err := c.PrefillBody(nil, tt.api, []byte(tt.body))
			require.NoError(t, err)
			assert.JSONEq(t, tt.wantPrefill, string(pre))
			dec, err := c.DecodeBody(nil, tt.api, []byte(tt.body), connectors.Handoff{})
			require.NoError(t, err)
			assert.JSONEq(t, tt.wantDecode, string(dec))
			assert.Equal(t, tt.decodeFirst, c.TryDecodeFirst(tt.api, []byte(tt.body)))
		})
	}
	assert.Equal(t, connectors.ChoreographyDecodeFirst, connectors.ChoreographyOf(c))
}

func TestDeclined(t *testing.T) {
	c := sharedstorage.New()
	tests := []struct {
		api  connectors.API
		data string
		want bool
	}{
		{connectors.APICompletions, `{"choices":[{"text":"","finish_reason":"cache_threshold"}]}`, true},
		{connectors.APIChat, `{"choices":[{"delta":{},"finish_reason":"cache_threshold"}]}`, true},
		{connectors.APIChat, `{"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]}`, false},
		{connectors.APIMessages, `{"type":"message_delta","delta":{"stop_reason":"cache_threshold"}}`, true},
		{connectors.APIMessages, `{"stop_reason":"end_turn"}`, false},
		{connectors.APIResponses, `{"type":"response.incomplete","response":{"incomplete_details":{"reason":"cache_threshold"}}}`, true},
		{connectors.APIGenerate, `{"choices":[{"token_ids":[],"finish_reason":"cache_threshold"}]}`, true},
		{connectors.APIGenerate, `{"choices":[{"token_ids":[4],"finish_reason":"length"}]}`, false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, c.Declined(tt.api, []byte(tt.data)), "%s %s", tt.api, tt.data)
	}
}

func TestParsePrefill(t *testing.T) {
	c := sharedstorage.New()
	h, err := c.ParsePrefill(connectors.APICompletions, []byte(`{"choices":[{"finish_reason":"length"}],"usage":{"prompt_tokens_details":{"cached_tokens":16}}}`))
	require.NoError(t, err)
	assert.Equal(t, connectors.Handoff{CachedTokens: 16}, h)
	h, err = c.ParsePrefill(connectors.APICompletions, []byte(`{"choices":[{"finish_reason":"stop"}]}`))
	require.NoError(t, err)
	assert.True(t, h.Done)
	_, err = c.ParsePrefill(connectors.APICompletions, []byte(`oops`))
	require.ErrorIs(t, err, connectors.ErrBadPrefillAnswer)
}
