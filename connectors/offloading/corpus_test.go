package offloading_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/offloading"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

// TestCorpusDecodeLeg: the decode leg's kv_transfer_params are vLLM's
// OffloadingConnector P2P shape (remote_prefiller with kv_request_id,
// remote_host, remote_port), member for member.
func TestCorpusDecodeLeg(t *testing.T) {
	s, err := wirecorpus.Get("vllm-offloading-p2p-decode-request")
	require.NoError(t, err)
	_, dec, err := offloading.New().Legs(connectors.APICompletions, []byte(`{"prompt":"x"}`),
		connectors.Pairing{PrefillHost: "10.0.0.5", KVRequestID: "9f1c2b7a-4e3d-4a8b-b6c5-0d1e2f3a4b5c", PrefillP2PPort: 5710})
	require.NoError(t, err)
	assert.JSONEq(t, string(s.Value), gjson.GetBytes(dec, "kv_transfer_params").Raw)
}
