package enginesim

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSGLangCancelledPrefillFreesRoom(t *testing.T) {
	p := startSim(t, RolePrefill, nil)
	body := `{"model":"sim-model","prompt":` + mustJSON(longPrompt(40)) + `,"max_tokens":5,"bootstrap_host":"127.0.0.1","bootstrap_port":` +
		mustJSON(p.BootstrapAddr().Port) + `,"bootstrap_room":77}`
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/v1/completions", strings.NewReader(body))
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return p.metric(t, "sim_kv_blocks_held") == 3 }, 30*time.Second, time.Millisecond,
		"the room's KV is held while no decoder pulled it")
	select {
	case <-done:
		t.Fatal("an SGLang prefill answers only once its KV was pulled")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-done
	require.Eventually(t, func() bool { return p.metric(t, "sim_kv_blocks_held") == 0 }, 30*time.Second, time.Millisecond)
	assert.Equal(t, 1.0, p.metric(t, "sim_kv_released_on_cancel_total"))
	assert.Equal(t, 0.0, p.metric(t, "sim_kv_lease_expired_total"))
}

func TestMooncakeQueryAndTransfer(t *testing.T) {
	p := startSim(t, RolePrefill, nil)
	d := startSim(t, RoleDecode, nil)
	boot := "http://" + p.BootstrapAddr().String()

	q, err := httpGet(boot + "/query")
	require.NoError(t, err)
	var m map[string]bootstrapEntry
	require.NoError(t, json.Unmarshal(q, &m), "%s", q)
	assert.Equal(t, p.EngineID(), m["0"].EngineID)
	assert.Equal(t, p.KVAddr().Port, m["0"].KVPort)

	prompt := longPrompt(37)
	cases := []struct {
		name, engineID string
		wantSame       bool
	}{
		{"right engine: the decode uses the prefill's KV", p.EngineID(), true},
		{"wrong engine id: the KV load fails", "not-the-engine", false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			xfer := "xfer-test-" + mustJSON(i)
			pre := `{"model":"sim-model","prompt":` + mustJSON(prompt) + `,"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":` + mustJSON(xfer) + `}}`
			dec := `{"model":"sim-model","prompt":` + mustJSON(prompt) + `,"max_tokens":6,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"transfer_id":` +
				mustJSON(xfer) + `,"remote_bootstrap_addr":` + mustJSON(boot) + `,"remote_engine_id":` + mustJSON(c.engineID) + `}}`
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			var a, b answer
			wg.Add(2)
			go func() { defer wg.Done(); b = post(t, d.url+"/v1/completions", dec) }()
			go func() { defer wg.Done(); a = postCtx(ctx, p.url+"/v1/completions", pre) }()
			if !c.wantSame {
				// The decode fails; the proxy would then cancel the
				// prefill leg, which frees its KV.
				require.Eventually(t, func() bool { return d.metric(t, "sim_kv_load_failures_total") == 1 }, 30*time.Second, time.Millisecond)
				require.Eventually(t, func() bool { return p.metric(t, "sim_kv_blocks_held") > 0 }, 30*time.Second, time.Millisecond)
				cancel()
			}
			wg.Wait()
			if c.wantSame {
				require.Equal(t, 200, a.status, "%s", a.body)
				require.Equal(t, 200, b.status, "%s", b.body)
				local := post(t, p.url+"/v1/completions", `{"model":"sim-model","prompt":`+mustJSON(prompt)+`,"max_tokens":6}`)
				assert.Equal(t, get(local.json, "choices", 0, "text"), get(b.json, "choices", 0, "text"))
				assert.Equal(t, 1.0, d.metric(t, "sim_mooncake_decodes_total"))
				assert.Equal(t, 1.0, d.metric(t, "sim_remote_kv_decodes_total"))
				assert.Equal(t, 1.0, p.metric(t, "sim_mooncake_prefills_total"))
			} else {
				assert.Equal(t, 500, b.status)
				require.Eventually(t, func() bool { return p.metric(t, "sim_kv_released_on_cancel_total") == 1 }, 30*time.Second, time.Millisecond)
			}
			require.Eventually(t, func() bool { return p.metric(t, "sim_kv_blocks_held") == 0 }, 30*time.Second, time.Millisecond)
		})
	}
	assert.Equal(t, 3.0, p.metric(t, "sim_mooncake_bootstrap_queries_total"), "the test's query and one per decode")
}

func TestSharedStorageThresholdAndLoad(t *testing.T) {
	dir := t.TempDir()
	p := startSim(t, RolePrefill, func(c *Config) { c.SharedStorageDir = dir })
	d := startSim(t, RoleDecode, func(c *Config) { c.SharedStorageDir = dir })
	ref := startSim(t, RoleBoth, nil)
	prompt := longPrompt(41)
	tests := []struct {
		name, path, body, finishPath string
		streamed                     bool
	}{
		{"completions", "/v1/completions", `{"model":"sim-model","prompt":` + mustJSON(prompt) + `,"max_tokens":5,"cache_hit_threshold":0.8}`, "choices.0.finish_reason", false},
		{"chat stream", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":` + mustJSON(prompt) + `}],"max_tokens":5,"stream":true,"cache_hit_threshold":0.8}`, "choices.0.finish_reason", true},
		{"messages", "/v1/messages", `{"model":"sim-model","messages":[{"role":"user","content":` + mustJSON(prompt+" m") + `}],"max_tokens":5,"cache_hit_threshold":0.8}`, "stop_reason", false},
		{"responses", "/v1/responses", `{"model":"sim-model","input":` + mustJSON(prompt+" r") + `,"max_output_tokens":5,"cache_hit_threshold":0.8}`, "incomplete_details.reason", false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.streamed {
				_, evs, err := stream(t, d.url+tt.path, tt.body)
				require.NoError(t, err)
				found := false
				for _, e := range evs {
					found = found || strings.Contains(e.data, `"finish_reason":"cache_threshold"`)
				}
				assert.True(t, found, "declined in the stream: %v", evs)
			} else {
				a := post(t, d.url+tt.path, tt.body)
				require.Equal(t, 200, a.status, "%s", a.body)
				var v any = a.json
				for _, k := range strings.Split(tt.finishPath, ".") {
					if k == "0" {
						v = get(v, 0)
					} else {
						v = get(v, k)
					}
				}
				assert.Equal(t, "cache_threshold", v, "%s", a.body)
			}
			assert.Equal(t, float64(i+1), d.metric(t, "sim_cache_threshold_declines_total"))

			// The prefill stores the KV; the decode (threshold 0) loads it.
			prefill := strings.Replace(strings.Replace(tt.body, `"cache_hit_threshold":0.8`, `"cache_hit_threshold":0`, 1), `"stream":true`, `"stream":false`, 1)
			require.Equal(t, 200, post(t, p.url+tt.path, prefill).status)
			dec := strings.Replace(prefill, `"cache_hit_threshold":0`, `"cache_hit_threshold":0.8`, 1)
			got := post(t, d.url+tt.path, dec)
			require.Equal(t, 200, got.status, "%s", got.body)
			want := post(t, ref.url+tt.path, prefill)
			require.Equal(t, 200, want.status)
			assert.NotEmpty(t, outputText(want.json))
			assert.Equal(t, outputText(want.json), outputText(got.json), "token-exact on KV from the store")
			assert.Equal(t, float64(i+1), d.metric(t, "sim_shared_storage_loads_total"))
		})
	}
	assert.Positive(t, p.metric(t, "sim_shared_storage_stored_blocks_total"))
	assert.Equal(t, 0.0, p.metric(t, "sim_kv_blocks_held"))
}

// postCtx posts body and returns the answer (status 0 when the request was
// cancelled).
func postCtx(ctx context.Context, url, body string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}
	}
	defer resp.Body.Close()
	var a answer
	a.status = resp.StatusCode
	_ = json.NewDecoder(resp.Body).Decode(&a.json)
	return a
}

// outputText is the generated text of a JSON answer of any API.
func outputText(a map[string]any) any {
	for _, path := range [][]any{{"choices", 0, "text"}, {"choices", 0, "message", "content"}, {"content", 0, "text"}, {"output", 0, "content", 0, "text"}} {
		if v := get(a, path...); v != nil {
			return v
		}
	}
	return nil
}
