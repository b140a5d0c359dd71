package e2e

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// p2pPeer is a remote_prefiller or remote_kv_source sub-dict.
func p2pPeer(id string, port int) string {
	b, _ := json.Marshal(map[string]any{"kv_request_id": id, "remote_host": "127.0.0.1", "remote_port": port})
	return string(b)
}

// TestEngineSimP2PTierOverProcesses plays the offloading connector by hand
// against engine-sim processes: a prefiller on a chosen --p2p-port, and a
// decoder whose P2P port (--p2p-port 0) the harness reads from its startup
// line and which then serves as another engine's remote_kv_source.
func TestEngineSimP2PTierOverProcesses(t *testing.T) {
	chosen := harness.FreePort(t)
	prefill := harness.StartEngineSim(t, "prefill", "--p2p-port", itoa(chosen))
	decode := harness.StartEngineSim(t, "decode", "--p2p-port", "0")
	require.Equal(t, chosen, prefill.P2PPort)
	require.NotZero(t, decode.P2PPort)

	kind := func(k string) map[string]string { return map[string]string{"kind": k} }
	status, local, _ := streamChat(t, decode.URL()+"/v1/chat/completions", chatBody(`,"max_tokens":12,"stream":true`))
	require.Equal(t, 200, status)

	// Prefill and decode legs sent concurrently, as the sidecar does.
	var wg sync.WaitGroup
	var remote string
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, remote, _ = streamChat(t, decode.URL()+"/v1/chat/completions",
			chatBody(`,"max_tokens":12,"stream":true,"kv_transfer_params":{"remote_prefiller":`+p2pPeer("req-1", prefill.P2PPort)+`}`))
	}()
	go func() {
		defer wg.Done()
		status, ans := postJSON(t, prefill.URL()+"/v1/chat/completions",
			chatBody(`,"max_tokens":1,"stream":false,"kv_transfer_params":{"remote_decoder":{"kv_request_id":"req-1"}}`))
		assert.Equal(t, 200, status, "%v", ans)
	}()
	wg.Wait()
	assert.Equal(t, local, remote, "the decode on P2P-pulled KV streams exactly the local tokens")
	blocks := decode.Metric(t, "sim_p2p_blocks_pulled_total", kind("prefill"))
	assert.Positive(t, blocks)
	assert.Equal(t, 1.0, decode.Metric(t, "sim_p2p_pulls_total", kind("prefill")))
	assert.Equal(t, 1.0, prefill.Metric(t, "sim_p2p_holds_total", nil))
	harness.Eventually(t, 30*time.Second, "the prefiller counts the blocks served and frees them", func() bool {
		return prefill.Metric(t, "sim_p2p_blocks_served_total", kind("prefill")) == blocks && prefill.Metric(t, "sim_kv_blocks_held", nil) == 0
	})

	// The decoder computed the prompt's blocks in its local run: as a
	// remote_kv_source it serves a fresh engine their full blocks.
	fresh := harness.StartEngineSim(t, "both")
	status, ans := postJSON(t, fresh.URL()+"/v1/chat/completions",
		chatBody(`,"max_tokens":12,"kv_transfer_params":{"remote_kv_source":`+p2pPeer("src-1", decode.P2PPort)+`}`))
	require.Equal(t, 200, status, "%v", ans)
	pulled := fresh.Metric(t, "sim_p2p_blocks_pulled_total", kind("source"))
	assert.Positive(t, pulled)
	assert.Equal(t, pulled*16, ans["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)["cached_tokens"])
	harness.Eventually(t, 30*time.Second, "the source counts the blocks served", func() bool {
		return decode.Metric(t, "sim_p2p_blocks_served_total", kind("source")) == pulled
	})
}
