package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// These tests run engine-sim as real processes on loopback and play the
// proxy by hand: they prove the simulator's P/D contract that every sidecar
// test builds on.

const simPrompt = "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole, " +
	"filled with the ends of worms and an oozy smell, nor yet a dry, bare, sandy hole."

const prefillParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

func postJSON(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m), "JSON body: %s", b)
	return resp.StatusCode, m
}

// streamChat posts a streaming chat request and returns the status, the
// concatenated content deltas and every data payload.
func streamChat(t *testing.T, url, body string) (int, string, []string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var text strings.Builder
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		events = append(events, data)
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &ev) == nil && len(ev.Choices) > 0 {
			text.WriteString(ev.Choices[0].Delta.Content)
		}
	}
	require.NoError(t, sc.Err())
	return resp.StatusCode, text.String(), events
}

func chatBody(extra string) string {
	return `{"model":"sim-model","messages":[{"role":"user","content":` + quote(simPrompt) + `}]` + extra + `}`
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// handoff runs the nixlv2 prefill leg by hand and returns the decode body.
func handoff(t *testing.T, prefill *harness.Engine) string {
	t.Helper()
	status, ans := postJSON(t, prefill.URL()+"/v1/chat/completions",
		chatBody(`,"max_tokens":1,"max_completion_tokens":1,"stream":false,"kv_transfer_params":`+prefillParams))
	require.Equal(t, 200, status, "%v", ans)
	kv, ok := ans["kv_transfer_params"].(map[string]any)
	require.True(t, ok, "prefill answer carries kv_transfer_params: %v", ans)
	b, _ := json.Marshal(kv)
	return chatBody(`,"max_tokens":12,"stream":true,"kv_transfer_params":` + string(b))
}

func TestEngineSimNixlHandoffOverProcesses(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")

	status, local, _ := streamChat(t, decode.URL()+"/v1/chat/completions", chatBody(`,"max_tokens":12,"stream":true`))
	require.Equal(t, 200, status)
	require.Len(t, strings.Fields(local), 12)

	prefillsBefore := prefill.Metric(t, "sim_remote_decode_prefills_total", nil)
	decodesBefore := decode.Metric(t, "sim_remote_kv_decodes_total", nil)
	localTokensBefore := decode.Metric(t, "sim_local_prefill_tokens_total", nil)

	body := handoff(t, prefill)
	assert.Positive(t, prefill.Metric(t, "sim_kv_blocks_held", nil), "blocks held for the decoder")
	status, remote, events := streamChat(t, decode.URL()+"/v1/chat/completions", body)
	require.Equal(t, 200, status)
	assert.Equal(t, local, remote, "the decode on transferred KV streams exactly the local tokens")
	assert.Equal(t, "[DONE]", events[len(events)-1])

	assert.Equal(t, prefillsBefore+1, prefill.Metric(t, "sim_remote_decode_prefills_total", nil))
	assert.Equal(t, decodesBefore+1, decode.Metric(t, "sim_remote_kv_decodes_total", nil))
	assert.Equal(t, localTokensBefore, decode.Metric(t, "sim_local_prefill_tokens_total", nil), "the decoder prefilled nothing itself")
	assert.Equal(t, 1.0, decode.Metric(t, "vllm:nixl_xfer_time_seconds", nil))
	harness.Eventually(t, 5*time.Second, "pulled blocks are freed", func() bool {
		return prefill.Metric(t, "sim_kv_blocks_held", nil) == 0
	})
}

func TestEngineSimCorruptKVOverProcesses(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	plain := harness.StartEngineSim(t, "decode")
	verifying := harness.StartEngineSim(t, "decode", "--kv-verify-checksums", "--kv-load-failure-policy", "recompute")
	failing := harness.StartEngineSim(t, "decode", "--kv-verify-checksums", "--kv-load-failure-policy", "fail")
	_, local, _ := streamChat(t, plain.URL()+"/v1/chat/completions", chatBody(`,"max_tokens":12,"stream":true`))

	status, _ := postJSON(t, prefill.URL()+"/sim/faults", `{"corrupt_kv":true}`)
	require.Equal(t, 200, status)

	_, corrupted, _ := streamChat(t, plain.URL()+"/v1/chat/completions", handoff(t, prefill))
	assert.NotEqual(t, local, corrupted, "corrupt KV yields different tokens")
	assert.Len(t, strings.Fields(corrupted), 12)

	_, recomputed, _ := streamChat(t, verifying.URL()+"/v1/chat/completions", handoff(t, prefill))
	assert.Equal(t, local, recomputed, "policy recompute: detected corruption, local prefill, right tokens")
	assert.Equal(t, 1.0, verifying.Metric(t, "sim_kv_load_failures_total", map[string]string{"policy": "recompute"}))
	assert.Equal(t, 0.0, verifying.Metric(t, "sim_remote_kv_decodes_total", nil))

	status, text, events := streamChat(t, failing.URL()+"/v1/chat/completions", handoff(t, prefill))
	assert.Equal(t, 200, status, "SSE already started")
	assert.Empty(t, text, "no content token before the error")
	require.Len(t, events, 3, "role chunk, error event, [DONE]: %v", events)
	assert.Contains(t, events[1], `"code":500`)
	assert.Equal(t, "[DONE]", events[2])
	assert.Equal(t, 1.0, failing.Metric(t, "sim_kv_load_failures_total", map[string]string{"policy": "fail"}))
}

func TestEngineSimLeaseExpiryOverProcesses(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill", "--kv-lease", "300ms")
	decode := harness.StartEngineSim(t, "decode")
	body := handoff(t, prefill)
	assert.Positive(t, prefill.Metric(t, "sim_kv_blocks_held", nil))
	harness.Eventually(t, 10*time.Second, "blocks released at lease expiry", func() bool {
		return prefill.Metric(t, "sim_kv_blocks_held", nil) == 0
	})
	assert.Equal(t, 1.0, prefill.Metric(t, "sim_kv_lease_expired_total", nil))
	status, text, events := streamChat(t, decode.URL()+"/v1/chat/completions", body)
	assert.Equal(t, 200, status)
	assert.Empty(t, text)
	assert.Contains(t, strings.Join(events, "\n"), `"InternalServerError"`, "a pull of expired blocks fails under policy fail")
	assert.Equal(t, 1.0, decode.Metric(t, "vllm:nixl_num_failed_transfers_total", nil))
}

func TestEngineSimInvalidFlagsExitNonZero(t *testing.T) {
	bin := harness.Binary(t, "engine-sim")
	for _, args := range [][]string{
		{"--role", "sideways"},
		{"--block-size", "0"},
		{"--kv-load-failure-policy", "maybe"},
		{"--faults", `{"status":200}`},
		{"--p2p-port", "70000"},
		{"--no-such-flag"},
	} {
		p := harness.Start(t, bin, append(args, "--port", "0")...)
		code, err := p.Wait(10 * time.Second)
		require.NoError(t, err, "%v must exit", args)
		assert.Equal(t, 2, code, "%v", args)
		assert.Contains(t, p.Output(), "engine-sim:", "%v: one clear line", args)
	}
}
