package e2e

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/status"
)

// TestShortPromptServedLocally: with --min-remote-prefill-tokens 64, a
// request naming the prefiller whose prompt is short (simPrompt: 157
// bytes, estimated 53 tokens; as a chat message 55) is served by the
// decode engine alone: the prefiller does no prefill, nothing falls back,
// the decline is counted apart (split_declined_total, mode local) and the
// status view shows it apart from fallbacks; a long prompt (simPrompt
// three times) is split. Each on the lane (the request sent whole) and on
// fasthttp's path (its head in two writes).
func TestShortPromptServedLocally(t *testing.T) {
	short := completionBody(`,"max_tokens":4`)
	shortChat := chatBody(`,"max_tokens":4,"stream":true`)
	long := `{"model":"sim-model","prompt":` + quote(strings.Repeat(simPrompt+" ", 3)) + `,"max_tokens":4}`
	for _, whole := range []bool{true, false} {
		name := map[bool]string{true: "lane", false: "fasthttp"}[whole]
		t.Run(name, func(t *testing.T) {
			rig := newRig(t, "--min-remote-prefill-tokens", "64")
			send := func(path, body string) {
				t.Helper()
				resp, b := exchangeRaw(t, rig.sc.Port, path, body, rig.header(), whole)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
				require.NotEmpty(t, answerOf(b), "an answer with tokens: %s", b)
				harness.Eventually(t, 30*time.Second, "the request ended", func() bool {
					return rig.scMetric(t, "pd_sidecar_inflight_requests", nil) == 0
				})
			}
			lane := func(n float64) float64 {
				if whole {
					return n
				}
				return 0
			}

			localTokens := rig.decode.Metric(t, "sim_local_prefill_tokens_total", nil)
			send("/v1/completions", short)
			send("/v1/chat/completions", shortChat)
			assert.Equal(t, 0.0, rig.prefill.Metric(t, "sim_remote_decode_prefills_total", nil), "no prefill on the prefiller")
			assert.Empty(t, simRequests(t, rig.prefill), "the prefiller was never contacted")
			assert.Greater(t, rig.decode.Metric(t, "sim_local_prefill_tokens_total", nil), localTokens, "the decoder prefilled the prompts itself")
			assert.Equal(t, 0.0, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil), "no decode on remote KV")
			assert.Equal(t, 2.0, rig.scMetric(t, "pd_sidecar_split_declined_total", map[string]string{"reason": "short_prompt"}))
			assert.Equal(t, 2.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "local", "code": "200"}))
			assert.Equal(t, 0.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "fallback"}))
			assert.Equal(t, 0.0, rig.scMetric(t, "pd_sidecar_fallbacks_total", nil), "a decline is no fallback")
			assert.Equal(t, 0.0, rig.scMetric(t, "pd_sidecar_prefill_duration_seconds", nil), "no prefill leg")
			assert.Equal(t, lane(2), rig.scMetric(t, laneRequests, nil), "the lane's requests")
			assert.Contains(t, rig.sc.Output(), `"prompt_tokens_estimate":53`, "the decline logged with its estimate")

			send("/v1/completions", long)
			assert.Equal(t, 1.0, rig.prefill.Metric(t, "sim_remote_decode_prefills_total", nil), "the long prompt prefilled on the prefiller")
			assert.Equal(t, 1.0, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil), "and decoded on its KV")
			assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
			assert.Equal(t, 2.0, rig.scMetric(t, "pd_sidecar_split_declined_total", nil), "the long prompt was not declined")
			assert.Equal(t, 0.0, rig.scMetric(t, "pd_sidecar_fallbacks_total", nil))
			assert.Equal(t, lane(3), rig.scMetric(t, laneRequests, nil), "the lane's requests")

			snap, err := status.Fetch(context.Background(), nil, rig.sc.URL())
			require.NoError(t, err)
			w := snap.Window
			assert.Equal(t, status.VerdictOperating, snap.Verdict, snap.Summary)
			assert.Contains(t, snap.Summary, "1 of 1 requests that named a prefiller")
			assert.Contains(t, snap.Summary, "2 more named a prefiller but were declined (short_prompt: 2)")
			assert.Equal(t, 2, w.Declined)
			assert.Equal(t, map[string]int{"short_prompt": 2}, w.DeclinedByReason)
			assert.Equal(t, 1, w.NamedPrefiller)
			assert.Equal(t, 1, w.Split)
			assert.Equal(t, 0, w.FellBack)
			assert.Equal(t, 2, w.Local)
			var text bytes.Buffer
			require.NoError(t, snap.WriteText(&text))
			assert.Regexp(t, `\n  declined \(short prompt\):\s+2\n`, text.String())
			assert.Regexp(t, `\n    fell back:\s+0\n`, text.String())
		})
	}
}

// TestShortPromptDeniedPrefillerStillRefused: the guard comes after the
// header's checks: a prefiller off the allowlist is answered 403 whatever
// the prompt's length, and a header that names no host:port falls back as
// before; neither is counted as declined.
func TestShortPromptDeniedPrefillerStillRefused(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	sc := harness.StartSidecar(t, decode.Port, "--min-remote-prefill-tokens", "64",
		"--enable-ssrf-protection", "--prefiller-allowlist", "127.0.0.1:1")
	short := completionBody(`,"max_tokens":4`)
	for _, whole := range []bool{true, false} {
		resp, b := exchangeRaw(t, sc.Port, "/v1/completions", short, map[string]string{"x-prefiller-host-port": prefill.HostPort()}, whole)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s", b)
		assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "not an allowed prefiller")
		resp, b = exchangeRaw(t, sc.Port, "/v1/completions", short, map[string]string{"x-prefiller-host-port": "not-a-host-port"}, whole)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	}
	assert.Equal(t, 0.0, sc.Metric(t, "pd_sidecar_split_declined_total", nil))
	assert.Equal(t, 2.0, sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": "prefiller_not_allowed"}))
	assert.Equal(t, 2.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "invalid_prefiller"}))
	assert.Empty(t, simRequests(t, prefill), "the prefiller was never contacted")
}
