package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

func TestSidecarClientCancelMidStream(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode", "--decode-us-per-token", "20000") // 2,000 tokens: 40 s, far past the cancel
	sc := harness.StartSidecar(t, decode.Port)
	body := chatBody(`,"max_tokens":2000,"stream":true`)
	_, cancel := openStream(t, sc.URL()+"/v1/chat/completions", body,
		map[string]string{"x-prefiller-host-port": prefill.HostPort()}, 3)
	assert.Equal(t, 1.0, running(t, decode))
	cancel()
	harness.Eventually(t, 30*time.Second, "decode engine stops running", func() bool {
		return running(t, decode) == 0 && running(t, prefill) == 0
	})
	assert.Less(t, decode.Metric(t, "vllm:generation_tokens_total", nil), 1000.0, "decode was cut short")
	harness.Eventually(t, 30*time.Second, "disconnect counted", func() bool {
		return sc.Metric(t, "pd_sidecar_client_disconnects_total", nil) == 1
	})
	assert.Equal(t, 1.0, decode.Metric(t, "sim_remote_kv_decodes_total", nil))
}

// cancelWhileWaiting sends a request through the sidecar, waits until engine
// e runs it, drops the client, and checks every engine is idle again.
func cancelWhileWaiting(t *testing.T, sc *harness.Sidecar, path, body string, hdr map[string]string, e *harness.Engine, all ...*harness.Engine) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sc.URL()+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			// The answer's head may arrive (SSE); the body never should.
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	harness.Eventually(t, 30*time.Second, "engine running the request", func() bool { return running(t, e) == 1 })
	cancel() // drops the connection
	<-done
	harness.Eventually(t, 30*time.Second, "every engine idle after the client left", func() bool {
		for _, x := range all {
			if running(t, x) != 0 {
				return false
			}
		}
		return true
	})
}

func TestSidecarClientCancelWaitingForFirstToken(t *testing.T) {
	t.Run("in prefill", func(t *testing.T) {
		prefill := harness.StartEngineSim(t, "prefill", "--prefill-us-per-token", "200000")
		decode := harness.StartEngineSim(t, "decode")
		sc := harness.StartSidecar(t, decode.Port, "--prefill-timeout", "30s")
		cancelWhileWaiting(t, sc, "/v1/chat/completions", chatBody(`,"max_tokens":50,"stream":true`),
			map[string]string{"x-prefiller-host-port": prefill.HostPort()}, prefill, prefill, decode)
		assert.Empty(t, simRequests(t, decode), "no decode leg after the client left")
		assert.Zero(t, sc.Metric(t, "pd_sidecar_fallbacks_total", nil), "a client leaving is no fallback")
	})
	t.Run("in decode kv pull", func(t *testing.T) {
		prefill := harness.StartEngineSim(t, "prefill", "--kv-bandwidth", "2000")
		decode := harness.StartEngineSim(t, "decode", "--kv-bandwidth", "2000")
		// No release leg (kvrelease_test.go): its pull, as slow, would
		// keep the engine running after the client left.
		sc := harness.StartSidecar(t, decode.Port, "--release-kv-on-cancel=false")
		cancelWhileWaiting(t, sc, "/v1/completions", completionBody(`,"max_tokens":50`),
			map[string]string{"x-prefiller-host-port": prefill.HostPort()}, decode, prefill, decode)
	})
	t.Run("in local prefill", func(t *testing.T) {
		decode := harness.StartEngineSim(t, "decode", "--prefill-us-per-token", "200000")
		sc := harness.StartSidecar(t, decode.Port)
		cancelWhileWaiting(t, sc, "/v1/completions", completionBody(`,"max_tokens":50,"stream":true`), nil, decode, decode)
	})
}

func TestSidecarDataParallelRanks(t *testing.T) {
	base := harness.FreePorts(t, 2)
	e0 := startEngineOn(t, base)
	e1 := startEngineOn(t, base+1)
	sc := harness.StartSidecar(t, base, "--data-parallel-size", "2")
	for rank, e := range []*harness.Engine{e0, e1} {
		url := harness.URL(sc.Port+rank) + "/v1/completions"
		st, b, _ := scPost(t, url, completionBody(`,"max_tokens":3`), nil)
		require.Equal(t, http.StatusOK, st, "%s", b)
		assert.Len(t, simRequests(t, e), 1, "rank %d reaches its own engine", rank)
	}
	// The rank-1 proxy also splits against its own engine.
	prefill := harness.StartEngineSim(t, "prefill")
	st, b, _ := scPost(t, harness.URL(sc.Port+1)+"/v1/completions", completionBody(`,"max_tokens":3`),
		map[string]string{"x-prefiller-host-port": prefill.HostPort()})
	require.Equal(t, http.StatusOK, st, "%s", b)
	assert.Equal(t, 1.0, e1.Metric(t, "sim_remote_kv_decodes_total", nil))
	assert.Zero(t, e0.Metric(t, "sim_remote_kv_decodes_total", nil))
}

func TestSidecarDecodeDiesMidStreamEndsWithError(t *testing.T) {
	rig := newRig(t)
	setFault(t, rig.decode, `{"die_after_chunks":3,"only":"decode"}`)
	st, _, events := scStream(t, rig.sc.URL()+"/v1/chat/completions", chatBody(`,"max_tokens":20,"stream":true`), rig.header())
	require.Equal(t, http.StatusOK, st)
	require.GreaterOrEqual(t, len(events), 2)
	assert.Equal(t, "[DONE]", events[len(events)-1])
	assert.True(t, gjson.Get(events[len(events)-2], "error").Exists(), "ends with an error event: %v", events)
}

func TestSidecarGracefulShutdownDrains(t *testing.T) {
	rig := newRig(t)
	body := completionBody(`,"max_tokens":1500,"stream":true`)
	br, _ := openStream(t, rig.sc.URL()+"/v1/completions", body, rig.header(), 2)
	require.NoError(t, rig.sc.Signal(syscall.SIGTERM))
	// The in-flight stream completes in full.
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(strings.TrimSpace(string(rest)), "data: [DONE]"), "stream drained to its end")
	assert.Equal(t, 1500-2, strings.Count(string(rest), `"text"`), "every token arrived")
	code, err := rig.sc.Wait(10 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
}

// startEngineOn starts a role-both engine-sim on a given HTTP port (the
// data-parallel layout needs consecutive ports), extra flags last.
func startEngineOn(t *testing.T, port int, extra ...string) *harness.Engine {
	t.Helper()
	e := &harness.Engine{Port: port, KVPort: harness.FreePort(t), BootstrapPort: harness.FreePort(t)}
	args := []string{"--role", "both", "--model", "sim-model",
		"--port", itoa(port), "--kv-port", itoa(e.KVPort), "--bootstrap-port", itoa(e.BootstrapPort)}
	e.Proc = harness.Start(t, harness.Binary(t, "engine-sim"), append(args, extra...)...)
	e.WaitHTTP(t, e.URL()+"/health", 30*time.Second)
	return e
}
