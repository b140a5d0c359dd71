package nixlv2_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

// TestCorpusPrefillAnswersHandOff: every prefill answer of the upstream
// corpus that the nixlv2 connector reads (vLLM's NIXL generations, pull
// and push, vllm-ascend's Mooncake, llm-d-inference-sim) hands off, and
// the decode leg carries every member that shape's decode side reads,
// with the value the prefill engine wrote; no member is reported
// undocumented.
func TestCorpusPrefillAnswersHandOff(t *testing.T) {
	shapes, err := wirecorpus.Select("nixlv2", wirecorpus.PrefillAnswer)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(shapes), 8)
	c := nixlv2.New()
	for _, s := range shapes {
		t.Run(s.Name, func(t *testing.T) {
			for _, api := range []connectors.API{connectors.APICompletions, connectors.APIChat, connectors.APIResponses} {
				answer := s.Body(`"choices":[{"text":"a","finish_reason":"length"}]`)
				h, err := c.ParsePrefill(api, answer)
				require.NoError(t, err, "%s", answer)
				assert.Empty(t, h.Unknown, "every member of an upstream shape is documented")
				dec, err := c.DecodeBody(nil, api, []byte(`{"model":"m","prompt":"p","max_tokens":9}`), h)
				require.NoError(t, err)
				got := gjson.GetBytes(dec, "kv_transfer_params")
				for _, m := range append(s.DecodeReads.Members, s.Members()...) {
					want := gjson.GetBytes(s.Value, m)
					if !want.Exists() {
						continue // read with a default
					}
					assert.JSONEq(t, want.Raw, got.Get(m).Raw, "member %s reaches the decode engine as written", m)
				}
				var v map[string]json.RawMessage
				require.NoError(t, json.Unmarshal([]byte(got.Raw), &v))
				assert.Len(t, v, len(s.Members()), "nothing added, nothing dropped")
			}
		})
	}
}

// TestCorpusDecodeAnswerIsHistoryParams: the decode node's answer with
// bidirectional KV transfer on is what multi-turn reuse reads.
func TestCorpusDecodeAnswerIsHistoryParams(t *testing.T) {
	shapes, err := wirecorpus.Select("nixlv2", wirecorpus.DecodeAnswer)
	require.NoError(t, err)
	require.NotEmpty(t, shapes)
	for _, s := range shapes {
		t.Run(s.Name, func(t *testing.T) {
			c, err := nixlv2.HistoryParams.Check(nil, gjson.ParseBytes(s.Value))
			require.NoError(t, err)
			assert.Empty(t, c.Unknown)
			assert.JSONEq(t, string(s.Value), string(c.Out))
		})
	}
}

// TestResponsesWithoutParamsNamesTheEngine: a /v1/responses prefill answer
// with no kv_transfer_params member at all is an engine before vLLM's PR
// #37424, said so; null is the plain no-params case.
func TestResponsesWithoutParamsNamesTheEngine(t *testing.T) {
	c := nixlv2.New()
	old := []byte(`{"id":"resp_1","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[]}`)
	_, err := c.ParsePrefill(connectors.APIResponses, old)
	require.ErrorIs(t, err, connectors.ErrResponsesNoKVParams)
	require.ErrorIs(t, err, connectors.ErrNoKVParams, "still the no_kv_params fallback")
	assert.Contains(t, err.Error(), "too old for P/D on this path")
	_, err = c.ParsePrefill(connectors.APIResponses, []byte(`{"id":"resp_1","output":[],"kv_transfer_params":null}`))
	require.ErrorIs(t, err, connectors.ErrNoKVParams)
	assert.NotErrorIs(t, err, connectors.ErrResponsesNoKVParams)
	_, err = c.ParsePrefill(connectors.APICompletions, []byte(`{"choices":[{"text":"a","finish_reason":"length"}]}`))
	assert.NotErrorIs(t, err, connectors.ErrResponsesNoKVParams, "other paths as before")
}

// TestCachedTokensFromThePrefillEngine: remote_num_cached_tokens, where the
// prefill engine names it, is the cached count the decode answer reports.
func TestCachedTokensFromThePrefillEngine(t *testing.T) {
	c := nixlv2.New()
	base := `"do_remote_prefill":true,"remote_block_ids":[[1]],"remote_engine_id":"e","remote_host":"10.0.0.9","remote_port":5600`
	answer := func(params string) []byte {
		return []byte(`{"choices":[{"text":"a","finish_reason":"length"}],"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":16}},"kv_transfer_params":{` + params + `}}`)
	}
	h, err := c.ParsePrefill(connectors.APICompletions, answer(base))
	require.NoError(t, err)
	assert.EqualValues(t, 16, h.CachedTokens, "the answer's usage")
	h, err = c.ParsePrefill(connectors.APICompletions, answer(base+`,"remote_num_cached_tokens":32`))
	require.NoError(t, err)
	assert.EqualValues(t, 32, h.CachedTokens, "the prefill engine's own count")
}
