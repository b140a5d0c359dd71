package e2e

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// chaosFaults are the prefillers of the chaos run, one per fault kind
// (engine-sim --faults), plus healthy ones.
var chaosFaults = []struct{ kind, faults string }{
	{"none", ""},
	{"none", ""},
	{"refuse", `{"refuse":true}`},
	{"hang", `{"hang":true}`},
	{"status_500", `{"status":500}`},
	{"die_mid_answer", `{"die_after_chunks":1}`},
	{"corrupt_kv", `{"corrupt_kv":true}`},
	{"expire_kv", `{"expire_kv":true}`},
}

// chaosResult is how one client stream ended.
type chaosResult struct {
	cancelled, completed, failedClear, wrong bool // none set: lost
}

// TestChaosSoak runs 1,000 concurrent streaming requests through the
// sidecar, each naming a random prefiller among healthy and faulty ones,
// with random client cancels, and checks: every completed stream is
// token-exact, every failed one ended with a JSON error, none was cut short
// without one, no KV is stranded, and the sidecar leaks no goroutine or fd.
func TestChaosSoak(t *testing.T) {
	const n, maxTokens, prompts = 1000, 12, 8
	sim := []string{"--max-running", "4096", "--kv-lease", "2s", "--decode-us-per-token", "300"}
	// The decode engine also dies mid-stream on 50 remote-KV decodes: those
	// streams have sent tokens already, so they must end with an error event.
	decode := harness.StartEngineSim(t, "decode", append(sim, "--kv-verify-checksums",
		"--faults", `{"die_after_chunks":4,"only":"decode","times":50}`)...)
	var pre []*harness.Engine
	for _, f := range chaosFaults {
		args := sim
		if f.faults != "" {
			args = append(append([]string(nil), sim...), "--faults", f.faults)
		}
		pre = append(pre, harness.StartEngineSim(t, "prefill", args...))
	}
	sc := harness.StartSidecar(t, decode.Port, "--prefill-timeout", "1s", "--log-level", "warn",
		"--max-concurrent-requests", "0")
	url := sc.URL() + "/v1/completions"
	body := func(i int) string {
		return `{"model":"sim-model","prompt":` + quote(fmt.Sprintf("%s chaos prompt %d", simPrompt, i)) +
			`,"max_tokens":` + itoa(maxTokens) + `,"stream":true}`
	}
	// Reference outputs: local runs, no prefiller.
	want := make([]string, prompts)
	for i := range want {
		st, text, _ := scStream(t, url, body(i), nil)
		require.Equal(t, http.StatusOK, st)
		want[i] = text
		require.NotEmpty(t, text)
	}
	baseGoroutines := sc.Metric(t, "go_goroutines", nil)
	baseFDs := sc.Metric(t, "process_open_fds", nil)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0}}
	results := make([]chaosResult, n)
	var started sync.WaitGroup
	var wg sync.WaitGroup
	gate := make(chan struct{})
	var cancels atomic.Int64
	for i := range n {
		started.Add(1)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			p := pre[rng.IntN(len(pre))]
			cancelAfter := -1
			if rng.IntN(10) == 0 {
				cancelAfter = rng.IntN(maxTokens)
			}
			started.Done()
			<-gate
			results[i] = chaosStream(client, url, body(i%prompts), p.HostPort(), want[i%prompts], cancelAfter)
			if results[i].cancelled {
				cancels.Add(1)
			}
		})
	}
	started.Wait()
	start := time.Now()
	close(gate)
	wg.Wait()
	took := time.Since(start)

	var completed, failed, lost, wrong int
	for i, r := range results {
		switch {
		case r.cancelled:
		case r.completed && r.wrong:
			wrong++
			t.Errorf("request %d: completed with output different from the local run", i)
		case r.completed:
			completed++
		case r.failedClear:
			failed++
		default:
			lost++
			t.Errorf("request %d: stream cut short without an error", i)
		}
	}
	faults := map[string]float64{"decode_dies_mid_stream": decode.Metric(t, "sim_faults_injected_total", nil)}
	for k, p := range pre {
		if chaosFaults[k].kind != "none" {
			faults[chaosFaults[k].kind] += p.Metric(t, "sim_faults_injected_total", nil)
		}
	}
	// Blocks held for decoders that never came (cancels, expired leases)
	// are freed by the lease; none may stay held.
	harness.Eventually(t, 10*time.Second, "no KV block held on any prefiller", func() bool {
		for _, p := range pre {
			if p.Metric(t, "sim_kv_blocks_held", nil) != 0 {
				return false
			}
		}
		return true
	})
	// Client keep-alive connections closed, the sidecar's idle upstream
	// connections expire (4 s): back to the baseline.
	client.CloseIdleConnections()
	var gr, fds float64
	harness.Eventually(t, 20*time.Second, "sidecar goroutines and fds back to their baseline", func() bool {
		gr, fds = sc.Metric(t, "go_goroutines", nil), sc.Metric(t, "process_open_fds", nil)
		return gr <= baseGoroutines+10 && fds <= baseFDs+10
	})
	t.Logf("sidecar goroutines %v (baseline %v), open fds %v (baseline %v)", gr, baseGoroutines, fds, baseFDs)
	rss := sc.Metric(t, "process_resident_memory_bytes", nil)
	fb := harness.Scrape(t, sc.URL()+"/metrics")
	t.Logf("chaos: %d requests in %v; client cancels %d; faults injected %v; completed token-exact %d; failed with a JSON error %d; lost %d; wrong/duplicated tokens %d; stranded blocks 0; sidecar RSS %.0f MiB (race build)",
		n, took.Round(time.Millisecond), cancels.Load(), faults, completed, failed, lost, wrong, rss/(1<<20))
	for _, r := range []string{"unreachable", "timeout", "server_error", "kv_load_failed", "circuit_open", "bad_answer"} {
		t.Logf("  fallbacks{reason=%q} = %v", r, fb.Value("pd_sidecar_fallbacks_total", map[string]string{"reason": r}))
	}
	assert.Zero(t, lost, "no stream cut short without an error")
	assert.Zero(t, wrong, "no lost or duplicated tokens")
	assert.Greater(t, completed, n/2)
	assert.Positive(t, failed, "decode deaths end streams with an error event")
	for _, f := range chaosFaults {
		if f.kind != "none" {
			assert.Positive(t, faults[f.kind], "fault %s injected", f.kind)
		}
	}
	assert.Less(t, rss, float64(1<<30))
}

// chaosStream runs one streaming request; cancelAfter >= 0 drops the
// connection after that many content events.
func chaosStream(client *http.Client, url, body, prefiller, want string, cancelAfter int) chaosResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return chaosResult{}
	}
	req.Header.Set("x-prefiller-host-port", prefiller)
	resp, err := client.Do(req)
	if err != nil {
		return chaosResult{}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
		return chaosResult{failedClear: gjson.Get(b.String(), "error.message").Exists()}
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	events, errEvent, done := 0, false, false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		if gjson.Get(data, "error").Exists() {
			errEvent = true
			continue
		}
		text.WriteString(gjson.Get(data, "choices.0.text").String())
		events++
		if events == cancelAfter {
			cancel()
			return chaosResult{cancelled: true}
		}
	}
	switch {
	case errEvent && done:
		return chaosResult{failedClear: true}
	case done:
		return chaosResult{completed: true, wrong: text.String() != want}
	}
	return chaosResult{}
}

// TestChaosDecodeRestart kills the decode engine under the sidecar: requests
// get a clear 503 during the gap, and succeed again once the engine is back
// on its port, without restarting the sidecar.
func TestChaosDecodeRestart(t *testing.T) {
	port := harness.FreePort(t)
	start := func() *harness.Engine {
		e := &harness.Engine{Port: port, KVPort: harness.FreePort(t), BootstrapPort: harness.FreePort(t)}
		e.Proc = harness.Start(t, harness.Binary(t, "engine-sim"), "--role", "decode", "--model", "sim-model",
			"--port", itoa(port), "--kv-port", itoa(e.KVPort), "--bootstrap-port", itoa(e.BootstrapPort))
		e.WaitHTTP(t, e.URL()+"/health", 30*time.Second)
		return e
	}
	prefill := harness.StartEngineSim(t, "prefill")
	decode := start()
	sc := harness.StartSidecar(t, port)
	hdr := map[string]string{"x-prefiller-host-port": prefill.HostPort()}
	body := completionBody(`,"max_tokens":6`)
	st, before, _ := scPost(t, sc.URL()+"/v1/completions", body, hdr)
	require.Equal(t, http.StatusOK, st)
	decode.Kill()
	for range 3 {
		st, b, _ := scPost(t, sc.URL()+"/v1/completions", body, hdr)
		require.Equal(t, http.StatusServiceUnavailable, st, "%s", b)
		assert.Equal(t, int64(503), gjson.GetBytes(b, "error.code").Int())
		st, b, _ = scPost(t, sc.URL()+"/v1/completions", body, nil)
		require.Equal(t, http.StatusServiceUnavailable, st, "%s", b)
	}
	resp, err := http.Get(sc.URL() + "/ready")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "not ready while the engine is down")
	decode = start()
	st, after, _ := scPost(t, sc.URL()+"/v1/completions", body, hdr)
	require.Equal(t, http.StatusOK, st, "%s", after)
	assert.Equal(t, textOf(before), textOf(after))
	assert.Equal(t, 1.0, decode.Metric(t, "sim_remote_kv_decodes_total", nil), "disaggregated again")
}
