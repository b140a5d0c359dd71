package enginesim

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const prefillKV = `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// nixlPrefill sends the prefill leg and returns its kv_transfer_params.
func nixlPrefill(t *testing.T, p *testSim, prompt string) map[string]any {
	t.Helper()
	a := post(t, p.url+"/v1/completions", `{"model":"sim-model","prompt":`+mustJSON(prompt)+`,"max_tokens":1,"stream":false,`+prefillKV+`}`)
	require.Equal(t, 200, a.status, "%s", a.body)
	require.Equal(t, "length", get(a.json, "choices", 0, "finish_reason"))
	kv, ok := get(a.json, "kv_transfer_params").(map[string]any)
	require.True(t, ok, "prefill answer carries kv_transfer_params: %s", a.body)
	return kv
}

func decodeBody(prompt string, kv map[string]any, extra string) string {
	return `{"model":"sim-model","prompt":` + mustJSON(prompt) + `,"max_tokens":6` + extra + `,"kv_transfer_params":` + mustJSON(kv) + `}`
}

func TestNixlHandoffMatchesLocal(t *testing.T) {
	p := startSim(t, RolePrefill, nil)
	d := startSim(t, RoleDecode, nil)
	prompt := longPrompt(50)
	local := post(t, d.url+"/v1/completions", `{"model":"sim-model","prompt":`+mustJSON(prompt)+`,"max_tokens":6}`)
	require.Equal(t, 200, local.status)

	kv := nixlPrefill(t, p, prompt)
	assert.Equal(t, true, kv["do_remote_prefill"])
	assert.Equal(t, false, kv["do_remote_decode"])
	assert.Equal(t, p.EngineID(), kv["remote_engine_id"])
	assert.EqualValues(t, p.KVAddr().Port, kv["remote_port"])
	assert.Equal(t, "127.0.0.1", kv["remote_host"])
	assert.EqualValues(t, 1, kv["tp_size"])
	assert.Len(t, get(kv, "remote_block_ids", 0), 4, "50 tokens in blocks of 16")
	assert.Equal(t, 4.0, p.metric(t, "sim_kv_blocks_held"))
	assert.Equal(t, 1.0, p.metric(t, "sim_remote_decode_prefills_total"))

	dec := post(t, d.url+"/v1/completions", decodeBody(prompt, kv, ""))
	require.Equal(t, 200, dec.status, "%s", dec.body)
	assert.Equal(t, get(local.json, "choices", 0, "text"), get(dec.json, "choices", 0, "text"), "decode on pulled KV = local run")
	assert.EqualValues(t, 50, get(dec.json, "usage", "prompt_tokens_details", "cached_tokens"), "the decoder reports all remote KV as cached")
	assert.Equal(t, 1.0, d.metric(t, "sim_remote_kv_decodes_total"))
	assert.Equal(t, 1.0, d.metric(t, "vllm:nixl_xfer_time_seconds"))
	assert.Equal(t, 50.0, d.metric(t, "sim_local_prefill_tokens_total"), "only the local run prefilled on the decoder")
	// The prefiller frees the blocks when the decoder's "done" arrives,
	// which may be just after the decode answered.
	require.Eventually(t, func() bool { return p.metric(t, "sim_kv_blocks_held") == 0 }, 30*time.Second, time.Millisecond, "blocks freed once pulled")

	again := post(t, d.url+"/v1/completions", decodeBody(prompt, kv, ""))
	assert.Equal(t, 500, again.status, "the same blocks cannot be pulled twice (policy fail)")
	assert.Equal(t, 1.0, d.metric(t, "vllm:nixl_num_failed_transfers_total"))
}

func TestNixlFlatBlockIDsAndChat(t *testing.T) {
	p := startSim(t, RoleBoth, nil)
	d := startSim(t, RoleBoth, nil)
	chat := `"messages":[{"role":"user","content":` + mustJSON(longPrompt(30)) + `}]`
	a := post(t, p.url+"/v1/chat/completions", `{"model":"sim-model",`+chat+`,"max_tokens":1,"max_completion_tokens":1,`+prefillKV+`}`)
	require.Equal(t, 200, a.status)
	kv := get(a.json, "kv_transfer_params").(map[string]any)
	kv["remote_block_ids"] = get(kv, "remote_block_ids", 0) // older vLLM: a flat list
	dec := post(t, d.url+"/v1/chat/completions", `{"model":"sim-model",`+chat+`,"max_tokens":5,"kv_transfer_params":`+mustJSON(kv)+`}`)
	require.Equal(t, 200, dec.status, "%s", dec.body)
	local := post(t, d.url+"/v1/chat/completions", `{"model":"sim-model",`+chat+`,"max_tokens":5}`)
	assert.Equal(t, get(local.json, "choices", 0, "message", "content"), get(dec.json, "choices", 0, "message", "content"))
	assert.Equal(t, 1.0, d.metric(t, "sim_remote_kv_decodes_total"))
}

func TestInvalidKVParamsPrefillLocally(t *testing.T) {
	d := startSim(t, RoleDecode, nil)
	for _, kv := range []string{
		`{"do_remote_prefill":true,"remote_engine_id":null,"remote_block_ids":[[1]],"remote_host":"127.0.0.1","remote_port":5600}`,
		`{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r","remote_block_ids":[[1]],"remote_host":"127.0.0.1"}`,
		`{"do_remote_prefill":"yes"}`,
	} {
		a := post(t, d.url+"/v1/completions", `{"model":"sim-model","prompt":"abc def","max_tokens":2,"kv_transfer_params":`+kv+`}`)
		require.Equal(t, 200, a.status, "%s", a.body)
	}
	assert.Equal(t, 3.0, d.metric(t, "sim_invalid_kv_params_total"))
	assert.Equal(t, 0.0, d.metric(t, "sim_remote_kv_decodes_total"))
	assert.Equal(t, 6.0, d.metric(t, "sim_local_prefill_tokens_total"))
}

func TestKVLoadFailurePolicies(t *testing.T) {
	prompt := longPrompt(20)
	t.Run("fail: JSON 500 with vLLM's body", func(t *testing.T) {
		p := startSim(t, RolePrefill, func(c *Config) { c.Faults = Faults{ExpireKV: true} })
		d := startSim(t, RoleDecode, nil)
		kv := nixlPrefill(t, p, prompt)
		require.Eventually(t, func() bool { return p.HeldBlocks() == 0 }, 30*time.Second, time.Millisecond)
		a := post(t, d.url+"/v1/completions", decodeBody(prompt, kv, ""))
		assert.Equal(t, 500, a.status)
		assert.JSONEq(t, `{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`, string(a.body))
		assert.Equal(t, 1.0, d.metric(t, "sim_kv_load_failures_total"))
		assert.Equal(t, 1.0, p.metric(t, "sim_kv_lease_expired_total"))
	})
	t.Run("fail: SSE role chunk, error event, DONE", func(t *testing.T) {
		p := startSim(t, RolePrefill, nil)
		d := startSim(t, RoleDecode, func(c *Config) { c.Faults = Faults{FailKVLoad: true, Only: "decode"} })
		a := post(t, p.url+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi there"}],"max_tokens":1,`+prefillKV+`}`)
		kv := get(a.json, "kv_transfer_params")
		status, evs, err := stream(t, d.url+"/v1/chat/completions",
			`{"model":"sim-model","messages":[{"role":"user","content":"hi there"}],"stream":true,"kv_transfer_params":`+mustJSON(kv)+`}`)
		require.NoError(t, err)
		assert.Equal(t, 200, status)
		require.Len(t, evs, 3)
		assert.Equal(t, "assistant", get(evs[0].obj(t), "choices", 0, "delta", "role"))
		assert.EqualValues(t, 500, get(evs[1].obj(t), "error", "code"))
		assert.Equal(t, "[DONE]", evs[2].data)
	})
	t.Run("recompute: local prefill gives the right tokens", func(t *testing.T) {
		p := startSim(t, RolePrefill, func(c *Config) { c.Faults = Faults{ExpireKV: true} })
		d := startSim(t, RoleDecode, func(c *Config) { c.KVLoadFailurePolicy = PolicyRecompute })
		kv := nixlPrefill(t, p, prompt)
		a := post(t, d.url+"/v1/completions", decodeBody(prompt, kv, ""))
		require.Equal(t, 200, a.status)
		local := post(t, d.url+"/v1/completions", `{"model":"sim-model","prompt":`+mustJSON(prompt)+`,"max_tokens":6}`)
		assert.Equal(t, get(local.json, "choices", 0, "text"), get(a.json, "choices", 0, "text"))
		assert.Equal(t, 0.0, d.metric(t, "sim_remote_kv_decodes_total"))
		assert.Equal(t, 40.0, d.metric(t, "sim_local_prefill_tokens_total"))
	})
}

func TestCorruptKV(t *testing.T) {
	prompt := longPrompt(40)
	t.Run("unverified: different tokens", func(t *testing.T) {
		p := startSim(t, RolePrefill, func(c *Config) { c.Faults = Faults{CorruptKV: true} })
		d := startSim(t, RoleDecode, nil)
		kv := nixlPrefill(t, p, prompt)
		dec := post(t, d.url+"/v1/completions", decodeBody(prompt, kv, ""))
		require.Equal(t, 200, dec.status)
		local := post(t, d.url+"/v1/completions", `{"model":"sim-model","prompt":`+mustJSON(prompt)+`,"max_tokens":6}`)
		assert.NotEqual(t, get(local.json, "choices", 0, "text"), get(dec.json, "choices", 0, "text"))
		assert.Equal(t, 1.0, d.metric(t, "sim_remote_kv_decodes_total"))
	})
	t.Run("verified: the load fails and the policy applies", func(t *testing.T) {
		p := startSim(t, RolePrefill, func(c *Config) { c.Faults = Faults{CorruptKV: true} })
		d := startSim(t, RoleDecode, func(c *Config) { c.KVVerifyChecksums = true; c.KVLoadFailurePolicy = PolicyRecompute })
		kv := nixlPrefill(t, p, prompt)
		dec := post(t, d.url+"/v1/completions", decodeBody(prompt, kv, ""))
		require.Equal(t, 200, dec.status)
		local := post(t, d.url+"/v1/completions", `{"model":"sim-model","prompt":`+mustJSON(prompt)+`,"max_tokens":6}`)
		assert.Equal(t, get(local.json, "choices", 0, "text"), get(dec.json, "choices", 0, "text"))
		assert.Equal(t, 1.0, d.metric(t, "sim_kv_load_failures_total"))
		assert.Equal(t, 0.0, d.metric(t, "sim_remote_kv_decodes_total"))
	})
}

func TestPrefillLegFinishedByEOSHoldsNothing(t *testing.T) {
	p := startSim(t, RolePrefill, func(c *Config) { c.Faults = Faults{EOSFirstToken: true} })
	a := post(t, p.url+"/v1/completions", `{"model":"sim-model","prompt":"abc","max_tokens":1,`+prefillKV+`}`)
	require.Equal(t, 200, a.status)
	assert.Equal(t, "stop", get(a.json, "choices", 0, "finish_reason"))
	assert.Nil(t, get(a.json, "kv_transfer_params"))
	assert.Equal(t, "", get(a.json, "choices", 0, "text"))
	assert.Equal(t, 0.0, p.metric(t, "sim_kv_blocks_held"))
}

func TestSGLangBootstrapRoom(t *testing.T) {
	p := startSim(t, RolePrefill, nil)
	d := startSim(t, RoleDecode, nil)
	prompt := longPrompt(33)
	boot := func(room uint64) string {
		return `,"bootstrap_host":"127.0.0.1","bootstrap_port":` + mustJSON(p.BootstrapAddr().Port) + `,"bootstrap_room":` + mustJSON(room)
	}
	body := `{"model":"sim-model","prompt":` + mustJSON(prompt) + `,"max_tokens":5`
	var wg sync.WaitGroup
	var dec, pre answer
	wg.Add(2)
	go func() { defer wg.Done(); dec = post(t, d.url+"/v1/completions", body+boot(1<<62+5)+`}`) }()
	require.Eventually(t, func() bool { // the decode waits for its room at the prefiller
		p.holds.mu.Lock()
		defer p.holds.mu.Unlock()
		return len(p.holds.waiters[1<<62+5]) == 1
	}, 30*time.Second, time.Millisecond)
	go func() { defer wg.Done(); pre = post(t, p.url+"/v1/completions", body+boot(1<<62+5)+`}`) }()
	wg.Wait()
	require.Equal(t, 200, pre.status, "%s", pre.body)
	require.Equal(t, 200, dec.status, "%s", dec.body)
	local := post(t, d.url+"/v1/completions", body+`}`)
	assert.Equal(t, get(local.json, "choices", 0, "text"), get(dec.json, "choices", 0, "text"))
	assert.Len(t, strings.Fields(get(pre.json, "choices", 0, "text").(string)), 1, "an SGLang prefill generates one token")
	assert.Equal(t, 1.0, p.metric(t, "sim_sglang_prefills_total"))
	assert.Equal(t, 1.0, d.metric(t, "sim_sglang_decodes_total"))
	assert.Equal(t, 1.0, d.metric(t, "sim_remote_kv_decodes_total"))
	require.Eventually(t, func() bool { return p.metric(t, "sim_kv_blocks_held") == 0 }, 30*time.Second, time.Millisecond, "room freed once pulled")
}

func TestSGLangDecodeWaitIsBounded(t *testing.T) {
	p := startSim(t, RolePrefill, nil)
	d := startSim(t, RoleDecode, func(c *Config) { c.BootstrapTimeout = 50 * time.Millisecond })
	body := `{"model":"sim-model","prompt":"x y","bootstrap_host":"127.0.0.1","bootstrap_port":` +
		mustJSON(p.BootstrapAddr().Port) + `,"bootstrap_room":9}`
	a := post(t, d.url+"/v1/completions", body)
	assert.Equal(t, 500, a.status, "no prefill for the room: the decode gives up")
}

func TestQueuePastMaxRunning(t *testing.T) {
	s := startSim(t, RoleBoth, func(c *Config) { c.MaxRunning = 1; c.DecodePerToken = 20 * time.Millisecond })
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			post(t, s.url+"/v1/completions", `{"model":"sim-model","prompt":"q","max_tokens":10}`)
		}()
	}
	require.Eventually(t, func() bool { return s.metric(t, "vllm:num_requests_waiting") == 2 }, 30*time.Second, time.Millisecond)
	assert.Equal(t, 1.0, s.metric(t, "vllm:num_requests_running"))
	wg.Wait()
	assert.Equal(t, 0.0, s.metric(t, "vllm:num_requests_waiting"))
	assert.Equal(t, 0.0, s.metric(t, "vllm:num_requests_running"))
}

func TestJournalRecordsRequests(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	post(t, s.url+"/v1/completions", `{"model":"sim-model","prompt":"q","max_tokens":1}`, "X-Request-Id", "rid-1")
	var entries []journalEntry
	r, err := httpGet(s.url + "/sim/requests")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(r, &entries))
	require.Len(t, entries, 1)
	assert.Equal(t, "/v1/completions", entries[0].Path)
	assert.Equal(t, []string{"rid-1"}, entries[0].Headers["x-request-id"])
	assert.JSONEq(t, `{"model":"sim-model","prompt":"q","max_tokens":1}`, string(entries[0].Body))
}
