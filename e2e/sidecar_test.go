package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// These tests run pd-sidecar between two engine-sim processes (a prefill
// and a decode engine) on loopback. Each asserts on the simulators' proof
// counters (KV really moved, or really did not) and on token-exact output.

func TestSidecarNoHeaderIsLocal(t *testing.T) {
	rig := newRig(t)
	body := completionBody(`,"max_tokens":8`)
	st, b, h := scPost(t, rig.sc.URL()+"/v1/completions", body, nil)
	require.Equal(t, http.StatusOK, st, "%s", b)
	assert.NotEmpty(t, textOf(b))
	assert.NotEmpty(t, h.Get("X-Request-Id"))
	assert.Positive(t, rig.decode.Metric(t, "sim_local_prefill_tokens_total", nil))
	assert.Zero(t, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
	assert.Empty(t, simRequests(t, rig.prefill), "the prefiller must not be contacted")
	assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "local", "code": "200"}))
}

func TestSidecarDisaggregatedCompletionsMatchLocal(t *testing.T) {
	rig := newRig(t)
	body := completionBody(`,"max_tokens":12,"min_tokens":2`)
	st, local, _ := scPost(t, rig.sc.URL()+"/v1/completions", body, nil)
	require.Equal(t, http.StatusOK, st)

	hdr := rig.header()
	hdr["X-Request-Id"] = "req-e2e-1"
	st, got, h := scPost(t, rig.sc.URL()+"/v1/completions", body, hdr)
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.Equal(t, textOf(local), textOf(got), "disaggregated output must equal the local run")
	assert.Equal(t, "req-e2e-1", h.Get("X-Request-Id"))
	assert.Equal(t, 1.0, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
	assert.Equal(t, 1.0, rig.prefill.Metric(t, "sim_remote_decode_prefills_total", nil))
	assert.Positive(t, gjson.GetBytes(got, "usage.prompt_tokens").Int())
	assert.Equal(t, int64(0), gjson.GetBytes(got, "usage.prompt_tokens_details.cached_tokens").Int(),
		"cached_tokens is the prefiller's value, not the decoder's 100%%")
	assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
	assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_kv_transfer_duration_seconds", nil))
	assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_prefiller_requests_total",
		map[string]string{"prefiller": rig.prefill.HostPort(), "outcome": "split"}))

	// What each leg carried.
	pre := simRequests(t, rig.prefill)
	require.Len(t, pre, 1)
	assert.Equal(t, []string{"req-e2e-1"}, pre[0].Headers["x-request-id"])
	assert.NotContains(t, pre[0].Headers, "x-prefiller-host-port")
	pb := string(pre[0].Body)
	assert.Equal(t, int64(1), gjson.Get(pb, "max_tokens").Int())
	assert.False(t, gjson.Get(pb, "min_tokens").Exists())
	assert.False(t, gjson.Get(pb, "stream").Bool())
	assert.True(t, gjson.Get(pb, "kv_transfer_params.do_remote_decode").Bool())
	assert.Equal(t, simPrompt, gjson.Get(pb, "prompt").String())

	dec := simRequests(t, rig.decode)
	require.Len(t, dec, 2)
	last := dec[1]
	assert.Equal(t, []string{"req-e2e-1"}, last.Headers["x-request-id"])
	assert.NotContains(t, last.Headers, "x-prefiller-host-port")
	db := string(last.Body)
	assert.Equal(t, int64(12), gjson.Get(db, "max_tokens").Int())
	assert.Equal(t, int64(2), gjson.Get(db, "min_tokens").Int())
	assert.True(t, gjson.Get(db, "kv_transfer_params.do_remote_prefill").Bool())
	assert.NotEmpty(t, gjson.Get(db, "kv_transfer_params.remote_engine_id").String())
}

func TestSidecarDisaggregatedChatStreamMatchesLocal(t *testing.T) {
	rig := newRig(t)
	body := chatBody(`,"max_tokens":10,"stream":true,"stream_options":{"include_usage":true}`)
	st, local, _ := scStream(t, rig.sc.URL()+"/v1/chat/completions", body, nil)
	require.Equal(t, http.StatusOK, st)
	st, got, events := scStream(t, rig.sc.URL()+"/v1/chat/completions", body, rig.header())
	require.Equal(t, http.StatusOK, st)
	require.NotEmpty(t, local)
	assert.Equal(t, local, got)
	assert.Equal(t, 1.0, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
	require.GreaterOrEqual(t, len(events), 3)
	assert.Equal(t, "assistant", gjson.Get(events[0], "choices.0.delta.role").String(), "role chunk first, once")
	assert.Equal(t, "[DONE]", events[len(events)-1])
	usage := gjson.Get(events[len(events)-2], "usage")
	require.True(t, usage.Exists(), "usage chunk: %v", events)
	assert.Equal(t, int64(0), usage.Get("prompt_tokens_details.cached_tokens").Int())
	pre := simRequests(t, rig.prefill)
	require.Len(t, pre, 1)
	assert.False(t, gjson.GetBytes(pre[0].Body, "stream_options").Exists())
	assert.Equal(t, int64(1), gjson.GetBytes(pre[0].Body, "max_completion_tokens").Int())
	dec := simRequests(t, rig.decode)
	assert.True(t, gjson.GetBytes(dec[len(dec)-1].Body, "stream_options.include_usage").Bool(), "restored on decode")
}

func TestSidecarDisaggregatedEveryAPI(t *testing.T) {
	rig := newRig(t)
	cases := []struct{ path, body, capPath string }{
		{"/v1/chat/completions", chatBody(`,"max_tokens":6`), "max_tokens"},
		{"/v1/responses", `{"model":"sim-model","input":` + quote(simPrompt) + `,"max_output_tokens":6}`, "max_output_tokens"},
		{"/v1/messages", `{"model":"sim-model","max_tokens":6,"messages":[{"role":"user","content":` + quote(simPrompt) + `}]}`, "max_tokens"},
		{"/inference/v1/generate", `{"model":"sim-model","token_ids":[5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22],"sampling_params":{"max_tokens":6}}`, "sampling_params.max_tokens"},
	}
	for i, c := range cases {
		t.Run(strings.TrimPrefix(c.path, "/"), func(t *testing.T) {
			st, local, _ := scPost(t, rig.sc.URL()+c.path, c.body, nil)
			require.Equal(t, http.StatusOK, st, "%s", local)
			st, got, _ := scPost(t, rig.sc.URL()+c.path, c.body, rig.header())
			require.Equal(t, http.StatusOK, st, "%s", got)
			assert.NotEmpty(t, textOf(got))
			assert.Equal(t, textOf(local), textOf(got))
			assert.Equal(t, float64(i+1), rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
			pre := simRequests(t, rig.prefill)
			assert.Equal(t, int64(1), gjson.GetBytes(pre[len(pre)-1].Body, c.capPath).Int())
		})
	}
}

func TestSidecarPrefillerFailuresFallBack(t *testing.T) {
	cases := []struct {
		name, fault, reason string
	}{
		{"refused", `{"refuse":true}`, "unreachable"},
		{"hung", `{"hang":true}`, "timeout"},
		{"500", `{"status":500}`, "server_error"},
		{"429", `{"status":429}`, "overloaded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rig := newRig(t, "--prefill-timeout", "1s")
			body := completionBody(`,"max_tokens":8`)
			st, local, _ := scPost(t, rig.sc.URL()+"/v1/completions", body, nil)
			require.Equal(t, http.StatusOK, st)
			setFault(t, rig.prefill, c.fault)
			var got []byte
			within(t, 1*time.Second+15*time.Second, func() { // by --prefill-timeout, with headroom: a hung prefiller never answers
				st, got, _ = scPost(t, rig.sc.URL()+"/v1/completions", body, rig.header())
			})
			require.Equal(t, http.StatusOK, st, "%s", got)
			assert.Equal(t, textOf(local), textOf(got))
			assert.Zero(t, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
			assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": c.reason}))
			assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "fallback", "code": "200"}))
			assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_prefiller_requests_total",
				map[string]string{"prefiller": rig.prefill.HostPort(), "outcome": "fallback", "reason": c.reason}))
			assert.Zero(t, rig.scMetric(t, "pd_sidecar_prefiller_requests_total", map[string]string{"outcome": "split"}))
			harness.Eventually(t, 30*time.Second, "the abandoned prefill leg was cancelled", func() bool {
				return running(t, rig.prefill) == 0
			})
		})
	}
}

func TestSidecarPrefillerDownFallsBack(t *testing.T) {
	decode := harness.StartEngineSim(t, "decode")
	sc := harness.StartSidecar(t, decode.Port)
	dead := harness.HostPort(harness.FreePort(t))
	st, b, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`),
		map[string]string{"x-prefiller-host-port": dead})
	require.Equal(t, http.StatusOK, st, "%s", b)
	assert.NotEmpty(t, textOf(b))
	assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "unreachable"}))
}

func TestSidecarPrefillRetriesThenSucceeds(t *testing.T) {
	rig := newRig(t, "--prefill-max-retries", "2", "--prefill-retry-backoff", "10ms")
	setFault(t, rig.prefill, `{"status":503,"times":1}`)
	st, b, _ := scPost(t, rig.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`), rig.header())
	require.Equal(t, http.StatusOK, st, "%s", b)
	assert.Equal(t, 1.0, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
	assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_prefill_retries_total", nil))
	assert.Zero(t, rig.scMetric(t, "pd_sidecar_fallbacks_total", nil))
}

func TestSidecarPrefiller400PassedThrough(t *testing.T) {
	rig := newRig(t)
	setFault(t, rig.prefill, `{"status":400}`)
	st, b, _ := scPost(t, rig.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`), rig.header())
	assert.Equal(t, http.StatusBadRequest, st, "%s", b)
	assert.True(t, gjson.GetBytes(b, "error").Exists(), "%s", b)
	assert.Empty(t, simRequests(t, rig.decode), "no decode leg, no local run")
	assert.Zero(t, rig.scMetric(t, "pd_sidecar_fallbacks_total", nil))
	assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_prefiller_requests_total", map[string]string{"outcome": "refused"}))
}

func TestSidecarDecodeEngineDownIs503(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	sc := harness.StartSidecar(t, harness.FreePort(t))
	for _, hdr := range []map[string]string{nil, {"x-prefiller-host-port": prefill.HostPort()}} {
		st, b, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`), hdr)
		assert.Equal(t, http.StatusServiceUnavailable, st, "%s", b)
		assert.Equal(t, int64(503), gjson.GetBytes(b, "error.code").Int(), "%s", b)
	}
	resp, err := http.Get(sc.URL() + "/ready")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}

func TestSidecarKVLoadFailureRecoversLocally(t *testing.T) {
	rig := newRig(t)
	jsonBody := completionBody(`,"max_tokens":8`)
	sseBody := chatBody(`,"max_tokens":8,"stream":true`)
	_, local, _ := scPost(t, rig.sc.URL()+"/v1/completions", jsonBody, nil)
	_, localSSE, _ := scStream(t, rig.sc.URL()+"/v1/chat/completions", sseBody, nil)

	setFault(t, rig.decode, `{"fail_kv_load":true,"only":"decode","times":1}`)
	st, got, _ := scPost(t, rig.sc.URL()+"/v1/completions", jsonBody, rig.header())
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.Equal(t, textOf(local), textOf(got))
	assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_kv_load_failures_total", nil))

	setFault(t, rig.decode, `{"fail_kv_load":true,"only":"decode","times":1}`)
	st, text, events := scStream(t, rig.sc.URL()+"/v1/chat/completions", sseBody, rig.header())
	require.Equal(t, http.StatusOK, st)
	assert.Equal(t, localSSE, text, "nothing lost or duplicated")
	roles := 0
	for _, e := range events {
		assert.False(t, gjson.Get(e, "error").Exists(), "no error reaches the client: %s", e)
		if gjson.Get(e, "choices.0.delta.role").Exists() {
			roles++
		}
	}
	assert.Equal(t, 1, roles, "the failed leg's role chunk was held back")
	assert.Equal(t, 2.0, rig.scMetric(t, "pd_sidecar_kv_load_failures_total", nil))
	assert.Equal(t, 2.0, rig.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "kv_load_failed"}))
}

func TestSidecarKVLoadFailureErrorPolicy(t *testing.T) {
	rig := newRig(t, "--on-kv-load-failure", "error")
	setFault(t, rig.decode, `{"fail_kv_load":true,"only":"decode"}`)
	st, b, _ := scPost(t, rig.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":8`), rig.header())
	assert.Equal(t, http.StatusInternalServerError, st)
	assert.Equal(t, int64(500), gjson.GetBytes(b, "error.code").Int(), "%s", b)
	assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_kv_load_failures_total", nil))
	assert.Zero(t, rig.scMetric(t, "pd_sidecar_fallbacks_total", nil))
}

func TestSidecarEOSOnFirstTokenSkipsDecode(t *testing.T) {
	rig := newRig(t)
	setFault(t, rig.prefill, `{"eos_first_token":true,"only":"prefill"}`)
	st, b, _ := scPost(t, rig.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":8`), rig.header())
	require.Equal(t, http.StatusOK, st, "%s", b)
	assert.Equal(t, "stop", gjson.GetBytes(b, "choices.0.finish_reason").String())
	assert.False(t, gjson.GetBytes(b, "kv_transfer_params").Exists())

	st, _, events := scStream(t, rig.sc.URL()+"/v1/chat/completions", chatBody(`,"max_tokens":8,"stream":true`), rig.header())
	require.Equal(t, http.StatusOK, st)
	require.GreaterOrEqual(t, len(events), 3)
	assert.Equal(t, "stop", gjson.Get(events[len(events)-2], "choices.0.finish_reason").String())
	assert.Equal(t, "[DONE]", events[len(events)-1])

	assert.Empty(t, simRequests(t, rig.decode), "no decode leg")
	assert.Len(t, simRequests(t, rig.prefill), 2, "one prefill leg per request")
	assert.Equal(t, 2.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
}

func TestSidecarTPGuardFallsBack(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill", "--tp-size", "2")
	decode := harness.StartEngineSim(t, "decode")
	sc := harness.StartSidecar(t, decode.Port, "--decode-tp-size", "1")
	st, b, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`),
		map[string]string{"x-prefiller-host-port": prefill.HostPort()})
	require.Equal(t, http.StatusOK, st, "%s", b)
	assert.Zero(t, decode.Metric(t, "sim_remote_kv_decodes_total", nil))
	assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "tp_mismatch"}))
}

func TestSidecarPassthroughModels(t *testing.T) {
	rig := newRig(t)
	resp, err := http.Get(rig.sc.URL() + "/v1/models?x=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var m struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	require.NoError(t, jsonDecode(resp, &m))
	require.NotEmpty(t, m.Data)
	assert.Equal(t, "sim-model", m.Data[0].ID)
	resp2, err := http.Get(rig.sc.URL() + "/ready")
	require.NoError(t, err)
	resp2.Body.Close()
	assert.Equal(t, http.StatusOK, resp2.StatusCode)
}

func TestSidecarInvalidFlagsExitNonZero(t *testing.T) {
	bin := harness.Binary(t, "pd-sidecar")
	for _, args := range [][]string{
		{"--port", "0"},
		{"--kv-connector", "bogus"},
		{"--on-kv-load-failure", "maybe"},
		{"--prefill-timeout", "-1s"},
		{"--data-parallel-size", "0"},
		{"--no-such-flag"},
	} {
		p := harness.Start(t, bin, args...)
		code, err := p.Wait(10 * time.Second)
		require.NoError(t, err, "%v", args)
		assert.Equal(t, 2, code, "%v", args)
		out := strings.TrimSpace(p.Output())
		assert.Equal(t, 1, strings.Count(out, "\n")+1, "one line: %q", out)
		assert.Contains(t, out, "pd-sidecar:")
	}
}

func TestSidecarInvalidPrefillerHeaderFallsBack(t *testing.T) {
	rig := newRig(t)
	for _, v := range []string{"not-a-host-port", "10.0.0.1:99999"} {
		st, b, _ := scPost(t, rig.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`),
			map[string]string{"x-prefiller-host-port": v})
		require.Equal(t, http.StatusOK, st, "%s", b)
	}
	assert.Equal(t, 2.0, rig.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "invalid_prefiller"}))
	assert.Empty(t, simRequests(t, rig.prefill))
}

func TestSidecarFallbackDisabledAnswersError(t *testing.T) {
	rig := newRig(t, "--prefill-fallback=false")
	setFault(t, rig.prefill, `{"status":500}`)
	st, b, _ := scPost(t, rig.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`), rig.header())
	assert.Equal(t, http.StatusBadGateway, st, "%s", b)
	assert.Equal(t, int64(502), gjson.GetBytes(b, "error.code").Int(), "%s", b)
	assert.Empty(t, simRequests(t, rig.decode), "no local run")
	assert.Zero(t, rig.scMetric(t, "pd_sidecar_fallbacks_total", nil))
}
