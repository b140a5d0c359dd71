package moriio_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

// TestCorpusPrefillAnswer: vLLM's MoRIIOConnector prefill answer (write
// mode) hands off, every member as the engine wrote it.
func TestCorpusPrefillAnswer(t *testing.T) {
	shapes, err := wirecorpus.Select("moriio", wirecorpus.PrefillAnswer)
	require.NoError(t, err)
	require.NotEmpty(t, shapes)
	for _, s := range shapes {
		t.Run(s.Name, func(t *testing.T) {
			h, err := moriio.ReadHandoffs(nixlv2.New()).ParsePrefill(connectors.APIChat, s.Body(`"choices":[{"finish_reason":"length"}]`))
			require.NoError(t, err)
			for _, m := range s.Members() {
				assert.JSONEq(t, gjson.GetBytes(s.Value, m).Raw, gjson.GetBytes(h.Params, m).Raw, "member %s", m)
			}
			assert.Empty(t, h.Unknown)
		})
	}
}
