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
