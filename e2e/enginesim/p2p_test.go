package enginesim

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// peer is a remote_prefiller or remote_kv_source sub-dict naming port.
func peer(id string, port int) map[string]any {
	return map[string]any{"kv_request_id": id, "remote_host": "127.0.0.1", "remote_port": port}
}

func p2pBody(prompt string, maxTokens int, kv map[string]any) string {
	b := `{"model":"sim-model","prompt":` + mustJSON(prompt) + `,"max_tokens":` + strconv.Itoa(maxTokens)
	if kv != nil {
		b += `,"kv_transfer_params":` + mustJSON(kv)
	}
	return b + `}`
}

// p2pPrefillBody is the offloading connector's prefill leg.
func p2pPrefillBody(prompt, id string, source map[string]any) string {
	kv := map[string]any{"remote_decoder": map[string]any{"kv_request_id": id}}
	if source != nil {
		kv["remote_kv_source"] = source
	}
	return `{"model":"sim-model","prompt":` + mustJSON(prompt) + `,"max_tokens":1,"stream":false,"kv_transfer_params":` + mustJSON(kv) + `}`
}

func TestP2PPrefillDecodeMatchesLocal(t *testing.T) {
	prompt := longPrompt(50) // 50 tokens: 4 blocks of 16
	cases := []struct {
		name        string
		decodeFirst bool
		viaSource   bool
	}{
		{"prefill first", false, false},
		{"decode first: the prefiller waits for the hold", true, false},
		{"prefill leg pulling its prefix from a kv source", false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := startSim(t, RolePrefill, nil)
			d := startSim(t, RoleDecode, nil)
			var source map[string]any
			if c.viaSource {
				src := startSim(t, RoleDecode, nil)
				require.Equal(t, 200, post(t, src.url+"/v1/completions", p2pBody(prompt, 1, nil)).status)
				source = peer("src-1", src.P2PAddr().Port)
			}
			var wg sync.WaitGroup
			var pre, dec answer
			wg.Add(2)
			go func() {
				defer wg.Done()
				dec = post(t, d.url+"/v1/completions", p2pBody(prompt, 6, map[string]any{"remote_prefiller": peer("x-1", p.P2PAddr().Port)}))
			}()
			if c.decodeFirst {
				require.Eventually(t, func() bool { return d.metric(t, "vllm:num_requests_running") == 1 }, 30*time.Second, time.Millisecond)
				require.Eventually(t, func() bool { // the decode is connected and waits for the hold
					p.holds.mu.Lock()
					defer p.holds.mu.Unlock()
					return len(p.holds.waiters[p2pKey("x-1")]) == 1
				}, 30*time.Second, time.Millisecond)
			}
			go func() { defer wg.Done(); pre = post(t, p.url+"/v1/completions", p2pPrefillBody(prompt, "x-1", source)) }()
			wg.Wait()
			require.Equal(t, 200, pre.status, "%s", pre.body)
			require.Equal(t, 200, dec.status, "%s", dec.body)
			assert.Nil(t, get(pre.json, "kv_transfer_params"), "the P2P prefill answers no kv_transfer_params")

			local := post(t, startSim(t, RoleBoth, nil).url+"/v1/completions", p2pBody(prompt, 6, nil))
			assert.Equal(t, get(local.json, "choices", 0, "text"), get(dec.json, "choices", 0, "text"), "decode on pulled KV = local run")
			assert.EqualValues(t, 50, get(dec.json, "usage", "prompt_tokens_details", "cached_tokens"))
			assert.Equal(t, 1.0, p.metric(t, "sim_p2p_holds_total"))
			assert.Equal(t, 1.0, d.kindMetric(t, "sim_p2p_pulls_total", p2pPrefill))
			assert.Equal(t, 4.0, d.kindMetric(t, "sim_p2p_blocks_pulled_total", p2pPrefill))
			assert.Equal(t, 1.0, d.metric(t, "sim_remote_kv_decodes_total"))
			assert.Equal(t, 0.0, d.metric(t, "sim_local_prefill_tokens_total"), "the decoder prefilled nothing")
			assert.Equal(t, 0.0, d.metric(t, "vllm:nixl_xfer_time_seconds"), "no NIXL transfer")
			require.Eventually(t, func() bool { return p.kindMetric(t, "sim_p2p_blocks_served_total", p2pPrefill) == 4 }, 30*time.Second, time.Millisecond)
			require.Eventually(t, func() bool { return p.HeldBlocks() == 0 }, 30*time.Second, time.Millisecond, "the pull released the hold")
			if c.viaSource {
				assert.Equal(t, 3.0, p.kindMetric(t, "sim_p2p_blocks_pulled_total", p2pSource), "the 3 full blocks came from the source")
				assert.EqualValues(t, 48, get(pre.json, "usage", "prompt_tokens_details", "cached_tokens"))
			}
		})
	}
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

func TestP2PPullFailurePolicies(t *testing.T) {
	prompt := longPrompt(40)
	cases := []struct {
		name, id  string
		wrongPort bool
		policy    string
		status    int
	}{
		{"wrong kv_request_id, fail", "other", false, PolicyFail, 500},
		{"wrong port, fail", "x-2", true, PolicyFail, 500},
		{"wrong kv_request_id, recompute", "other", false, PolicyRecompute, 200},
		{"wrong port, recompute", "x-2", true, PolicyRecompute, 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := startSim(t, RolePrefill, nil)
			d := startSim(t, RoleDecode, func(cfg *Config) { cfg.KVLoadFailurePolicy = c.policy; cfg.BootstrapTimeout = 100 * time.Millisecond })
			require.Equal(t, 200, post(t, p.url+"/v1/completions", p2pPrefillBody(prompt, "x-2", nil)).status)
			port := p.P2PAddr().Port
			if c.wrongPort {
				port = closedPort(t)
			}
			a := post(t, d.url+"/v1/completions", p2pBody(prompt, 6, map[string]any{"remote_prefiller": peer(c.id, port)}))
			require.Equal(t, c.status, a.status, "%s", a.body)
			assert.Equal(t, 1.0, d.kindMetric(t, "sim_p2p_pull_failures_total", p2pPrefill))
			assert.Equal(t, 0.0, d.kindMetric(t, "sim_p2p_pulls_total", p2pPrefill))
			assert.Equal(t, 1.0, d.metric(t, "sim_kv_load_failures_total"))
			assert.Equal(t, 0.0, p.kindMetric(t, "sim_p2p_blocks_served_total", p2pPrefill))
			if c.policy == PolicyFail {
				assert.JSONEq(t, `{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`, string(a.body))
				return
			}
			local := post(t, d.url+"/v1/completions", p2pBody(prompt, 6, nil))
			assert.Equal(t, get(local.json, "choices", 0, "text"), get(a.json, "choices", 0, "text"))
		})
	}
}

func TestP2PCorruptKVGivesOtherTokens(t *testing.T) {
	prompt := longPrompt(40)
	p := startSim(t, RolePrefill, func(c *Config) { c.Faults = Faults{CorruptKV: true} })
	d := startSim(t, RoleDecode, nil)
	require.Equal(t, 200, post(t, p.url+"/v1/completions", p2pPrefillBody(prompt, "x-3", nil)).status)
	dec := post(t, d.url+"/v1/completions", p2pBody(prompt, 6, map[string]any{"remote_prefiller": peer("x-3", p.P2PAddr().Port)}))
	require.Equal(t, 200, dec.status)
	local := post(t, d.url+"/v1/completions", p2pBody(prompt, 6, nil))
	assert.NotEqual(t, get(local.json, "choices", 0, "text"), get(dec.json, "choices", 0, "text"), "the tokens derive from the pulled bytes")
}

func TestP2PKVSource(t *testing.T) {
	prompt := longPrompt(50) // 3 full blocks and a partial one
	cases := []struct {
		name        string
		warm        bool // the source served the prompt before
		unreachable bool
		blocks      float64
		cached      int
	}{
		{"a source that served the prefix: its full blocks are pulled", true, false, 3, 48},
		{"a fresh source serves no block", false, false, 0, 0},
		{"an unreachable source: counted, prefilled locally", false, true, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := startSim(t, RoleDecode, nil)
			q := startSim(t, RoleDecode, nil)
			if c.warm {
				require.Equal(t, 200, post(t, src.url+"/v1/completions", p2pBody(longPrompt(60), 1, nil)).status)
			}
			port := src.P2PAddr().Port
			if c.unreachable {
				port = closedPort(t)
			}
			a := post(t, q.url+"/v1/completions", p2pBody(prompt, 6, map[string]any{"remote_kv_source": peer("y-1", port)}))
			require.Equal(t, 200, a.status, "%s", a.body)
			local := post(t, startSim(t, RoleBoth, nil).url+"/v1/completions", p2pBody(prompt, 6, nil))
			assert.Equal(t, get(local.json, "choices", 0, "text"), get(a.json, "choices", 0, "text"))
			assert.EqualValues(t, c.cached, get(a.json, "usage", "prompt_tokens_details", "cached_tokens"))
			assert.Equal(t, c.blocks, q.kindMetric(t, "sim_p2p_blocks_pulled_total", p2pSource))
			if c.unreachable {
				assert.Equal(t, 1.0, q.kindMetric(t, "sim_p2p_pull_failures_total", p2pSource))
				assert.Equal(t, 0.0, q.kindMetric(t, "sim_p2p_pulls_total", p2pSource))
				return
			}
			assert.Equal(t, 0.0, q.kindMetric(t, "sim_p2p_pull_failures_total", p2pSource))
			assert.Equal(t, 1.0, q.kindMetric(t, "sim_p2p_pulls_total", p2pSource))
			require.Eventually(t, func() bool { return src.kindMetric(t, "sim_p2p_blocks_served_total", p2pSource) == c.blocks }, 30*time.Second, time.Millisecond)
			// Pulled (or computed) blocks are in the puller's prefix cache now,
			// so it asks the source for nothing.
			again := post(t, q.url+"/v1/completions", p2pBody(prompt, 6, map[string]any{"remote_kv_source": peer("y-2", port)}))
			assert.EqualValues(t, 48, get(again.json, "usage", "prompt_tokens_details", "cached_tokens"))
			assert.Equal(t, 1.0, q.kindMetric(t, "sim_p2p_pulls_total", p2pSource), "no second pull")
			assert.Equal(t, get(a.json, "choices", 0, "text"), get(again.json, "choices", 0, "text"))
		})
	}
}

func TestP2PKVSourceOnNixlPrefillLeg(t *testing.T) {
	prompt := longPrompt(50)
	src := startSim(t, RoleDecode, nil)
	require.Equal(t, 200, post(t, src.url+"/v1/completions", p2pBody(prompt, 1, nil)).status)
	p := startSim(t, RolePrefill, nil)
	d := startSim(t, RoleDecode, nil)
	body := `{"model":"sim-model","prompt":` + mustJSON(prompt) + `,"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null,"remote_kv_source":` + mustJSON(peer("y-2", src.P2PAddr().Port)) + `}}`
	a := post(t, p.url+"/v1/completions", body)
	require.Equal(t, 200, a.status, "%s", a.body)
	assert.EqualValues(t, 48, get(a.json, "usage", "prompt_tokens_details", "cached_tokens"))
	assert.Equal(t, 3.0, p.kindMetric(t, "sim_p2p_blocks_pulled_total", p2pSource))
	kv, ok := get(a.json, "kv_transfer_params").(map[string]any)
	require.True(t, ok, "the NIXL prefill still answers kv_transfer_params: %s", a.body)
	dec := post(t, d.url+"/v1/completions", decodeBody(prompt, kv, ""))
	require.Equal(t, 200, dec.status, "%s", dec.body)
	local := post(t, src.url+"/v1/completions", p2pBody(prompt, 6, nil))
	assert.Equal(t, get(local.json, "choices", 0, "text"), get(dec.json, "choices", 0, "text"))
}

// freeRun returns the first of n consecutive free loopback ports.
func freeRun(t *testing.T, n int) int {
	t.Helper()
	for range 200 {
		base := 20000 + rand.IntN(12000)
		ok := true
		for p := base; p < base+n && ok; p++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if ok = err == nil; ok {
				l.Close()
			}
		}
		if ok {
			return base
		}
	}
	t.Fatal("no consecutive free ports")
	return 0
}

func TestP2PDataParallelRanks(t *testing.T) {
	base := freeRun(t, 2)
	ranks := []*testSim{
		startSim(t, RoleBoth, func(c *Config) { c.P2PPort = base }),
		startSim(t, RoleBoth, func(c *Config) { c.P2PPort = base + 1 }),
	}
	d := startSim(t, RoleDecode, func(c *Config) { c.BootstrapTimeout = 100 * time.Millisecond })
	prompt := longPrompt(35)
	local := post(t, d.url+"/v1/completions", p2pBody(prompt, 5, nil))
	for r, e := range ranks {
		require.Equal(t, base+r, e.P2PAddr().Port)
		id := "rank-" + strconv.Itoa(r)
		require.Equal(t, 200, post(t, e.url+"/v1/completions", p2pPrefillBody(prompt, id, nil)).status)
		other := post(t, d.url+"/v1/completions", p2pBody(prompt, 5, map[string]any{"remote_prefiller": peer(id, base+1-r)}))
		assert.Equal(t, 500, other.status, "rank %d's hold is not on the other rank's port", r)
		dec := post(t, d.url+"/v1/completions", p2pBody(prompt, 5, map[string]any{"remote_prefiller": peer(id, base+r)}))
		require.Equal(t, 200, dec.status, "%s", dec.body)
		assert.Equal(t, get(local.json, "choices", 0, "text"), get(dec.json, "choices", 0, "text"))
		assert.Equal(t, 1.0, e.metric(t, "sim_p2p_holds_total"))
	}
	assert.Equal(t, 2.0, d.kindMetric(t, "sim_p2p_pulls_total", p2pPrefill))
	assert.Equal(t, 2.0, d.kindMetric(t, "sim_p2p_pull_failures_total", p2pPrefill))
}

func TestP2PParamsValidation(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	cases := []struct {
		name, kv, param string
	}{
		{"remote_decoder not an object", `{"remote_decoder":"x"}`, "kv_transfer_params.remote_decoder"},
		{"remote_decoder without kv_request_id", `{"remote_decoder":{}}`, "kv_transfer_params.remote_decoder.kv_request_id"},
		{"kv_request_id not a string", `{"remote_decoder":{"kv_request_id":5}}`, "kv_transfer_params.remote_decoder.kv_request_id"},
		{"remote_prefiller port 0", `{"remote_prefiller":{"kv_request_id":"a","remote_host":"h","remote_port":0}}`, "kv_transfer_params.remote_prefiller.remote_port"},
		{"remote_prefiller port too big", `{"remote_prefiller":{"kv_request_id":"a","remote_host":"h","remote_port":70000}}`, "kv_transfer_params.remote_prefiller.remote_port"},
		{"remote_prefiller port a string", `{"remote_prefiller":{"kv_request_id":"a","remote_host":"h","remote_port":"7777"}}`, "kv_transfer_params.remote_prefiller.remote_port"},
		{"remote_prefiller without port", `{"remote_prefiller":{"kv_request_id":"a","remote_host":"h"}}`, "kv_transfer_params.remote_prefiller.remote_port"},
		{"remote_prefiller without host", `{"remote_prefiller":{"kv_request_id":"a","remote_port":7777}}`, "kv_transfer_params.remote_prefiller.remote_host"},
		{"remote_kv_source without kv_request_id", `{"remote_kv_source":{"remote_host":"h","remote_port":7777}}`, "kv_transfer_params.remote_kv_source.kv_request_id"},
		{"remote_kv_source a list", `{"remote_kv_source":[]}`, "kv_transfer_params.remote_kv_source"},
		{"remote_decoder with remote_prefiller", `{"remote_decoder":{"kv_request_id":"a"},"remote_prefiller":{"kv_request_id":"a","remote_host":"h","remote_port":1}}`, "kv_transfer_params"},
		{"remote_decoder with do_remote_decode", `{"do_remote_decode":true,"remote_decoder":{"kv_request_id":"a"}}`, "kv_transfer_params"},
		{"remote_prefiller with do_remote_prefill", `{"do_remote_prefill":true,"remote_prefiller":{"kv_request_id":"a","remote_host":"h","remote_port":1}}`, "kv_transfer_params"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := post(t, s.url+"/v1/completions", `{"model":"sim-model","prompt":"a b","max_tokens":2,"kv_transfer_params":`+c.kv+`}`)
			require.Equal(t, 400, a.status, "%s", a.body)
			assert.Equal(t, "BadRequestError", get(a.json, "error", "type"))
			assert.Equal(t, c.param, get(a.json, "error", "param"))
			assert.Equal(t, float64(i+1), s.metric(t, "sim_bad_requests_total"))
		})
	}
	t.Run("null sub-dicts are absent", func(t *testing.T) {
		a := post(t, s.url+"/v1/completions", `{"model":"sim-model","prompt":"a b","max_tokens":2,"kv_transfer_params":{"remote_decoder":null,"remote_prefiller":null,"remote_kv_source":null}}`)
		require.Equal(t, 200, a.status, "%s", a.body)
		assert.Equal(t, 0.0, s.metric(t, "sim_p2p_holds_total"))
	})
}
