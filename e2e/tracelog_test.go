package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestTraceLevelLogsLegs: at trace level (llm-d's --zap-log-level 5) the
// sidecar logs each leg's head and body, the prefill leg's and the decode
// leg's of a split, with credentials redacted; at debug level it logs no
// body.
func TestTraceLevelLogsLegs(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	const secret = "Bearer sk-trace-secret-7f3a"
	hdr := map[string]string{"x-prefiller-host-port": prefill.HostPort(), "Authorization": secret}
	for _, level := range []string{"trace", "debug"} {
		t.Run(level, func(t *testing.T) {
			sc := harness.StartSidecar(t, decode.Port, "--log-level", level)
			st, _, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":3,"user":"trace-marker-91"`), hdr)
			require.Equal(t, http.StatusOK, st)
			require.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated"}), "the split happened")
			// The request's last line is written as it ends; the output pipe
			// may still carry it.
			harness.Eventually(t, 30*time.Second, "the request's log lines", func() bool {
				return strings.Contains(sc.Output(), `"message":"answered"`)
			})
			out := sc.Output()
			assert.NotContains(t, out, "sk-trace-secret", "credentials never reach the log")
			legs := map[string]map[string]any{}
			for _, line := range strings.Split(out, "\n") {
				var m map[string]any
				if json.Unmarshal([]byte(line), &m) != nil || m["message"] != "leg sent" {
					continue
				}
				legs[m["leg"].(string)] = m
			}
			if level == "debug" {
				assert.Empty(t, legs)
				assert.NotContains(t, out, "trace-marker-91")
				return
			}
			require.Len(t, legs, 2, "the prefill leg and the decode leg")
			pre, dec := legs[prefill.HostPort()], legs[decode.HostPort()]
			require.NotNil(t, pre)
			require.NotNil(t, dec)
			for name, leg := range map[string]map[string]any{"prefill": pre, "decode": dec} {
				assert.Contains(t, leg["body"], "trace-marker-91", name)
				assert.Equal(t, "[redacted]", leg["headers"].(map[string]any)["Authorization"], name)
				assert.Equal(t, "/v1/completions", leg["uri"], name)
			}
			assert.Contains(t, pre["body"], `"do_remote_decode":true`)
			assert.Contains(t, dec["body"], `"remote_engine_id"`)
		})
	}
}
