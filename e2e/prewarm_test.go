package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// handshakeDelay is the decode engine's NIXL handshake in the prewarm
// tests: what the first transfer from a new prefiller pays. Long enough
// that a request which does not pay it (a few-token split, tens of
// milliseconds) stays far under half of it on a loaded machine; a request
// that pays it can never be faster than it.
const handshakeDelay = 5 * time.Second

// prewarmRig is a prefill engine, a decode engine whose first pull from a
// prefiller engine pays handshakeDelay, and a sidecar with flags.
func prewarmRig(t *testing.T, flags ...string) *pdRig {
	t.Helper()
	r := &pdRig{
		prefill: harness.StartEngineSim(t, "prefill"),
		decode:  harness.StartEngineSim(t, "decode", "--kv-handshake-delay", handshakeDelay.String()),
	}
	r.sc = harness.StartSidecar(t, r.decode.Port, flags...)
	return r
}

// splitTimed sends a completion of prompt naming the rig's prefiller, whole
// in one write (the lane's) or its head in two (fasthttp's), and returns
// how long the answer took.
func (r *pdRig) splitTimed(t *testing.T, prompt string, whole bool) time.Duration {
	t.Helper()
	body := `{"model":"sim-model","prompt":` + quote(prompt) + `,"max_tokens":4}`
	start := time.Now()
	resp, b := exchangeRaw(t, r.sc.Port, "/v1/completions", body, r.header(), whole)
	took := time.Since(start)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	return took
}

// TestPrefillPrewarm: with --prefill-prewarm, the first request naming a
// new prefiller makes the sidecar warm it up in the background (one split
// whose decode pays the decode engine's handshake with it), so that a
// request after the warm-up pays no handshake; without it, the first
// request after a new prefiller pays it. Both serving paths: the lane
// (request whole in one write) and fasthttp (head in two writes).
func TestPrefillPrewarm(t *testing.T) {
	for _, path := range []struct {
		name  string
		whole bool
	}{{"lane", true}, {"fasthttp", false}} {
		t.Run(path.name, func(t *testing.T) {
			t.Run("prewarm", func(t *testing.T) {
				r := prewarmRig(t, "--prefill-prewarm")
				// The request that reveals the prefiller does not wait for
				// the warm-up; it may share its handshake.
				first := r.splitTimed(t, "a first request to a new prefiller", path.whole)
				harness.Eventually(t, 30*time.Second, "the warm-up done", func() bool {
					return r.scMetric(t, "pd_sidecar_prewarms_total", map[string]string{"result": "ok"}) == 1
				})
				took := r.splitTimed(t, "a request after the warm-up", path.whole)
				t.Logf("first request %v, request after the warm-up %v", first, took)
				assert.Less(t, took, handshakeDelay/2, "the handshake was paid by the warm-up")

				assert.Equal(t, 1.0, r.decode.Metric(t, "sim_kv_handshakes_total", nil), "one handshake: the warm-up's (shared by the first request)")
				assert.Equal(t, 3.0, r.decode.Metric(t, "sim_remote_kv_decodes_total", nil), "two requests and the warm-up decoded on pulled KV")
				assert.Equal(t, 3.0, r.prefill.Metric(t, "sim_remote_decode_prefills_total", nil))
				assert.Equal(t, 0.0, r.scMetric(t, "pd_sidecar_prewarms_total", map[string]string{"result": "failed"}))
				assert.Equal(t, 0.0, r.scMetric(t, "pd_sidecar_prewarms_total", map[string]string{"result": "skipped"}))
				// The warm-up is no client request.
				assert.Equal(t, 2.0, r.scMetric(t, "pd_sidecar_requests_total", nil))
				assert.Equal(t, 2.0, r.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
				assert.Equal(t, 2.0, r.scMetric(t, "pd_sidecar_prefill_duration_seconds", nil))
				lane := 0.0
				if path.whole {
					lane = 2
				}
				assert.Equal(t, lane, r.scMetric(t, laneRequests, nil), "served on the %s path", path.name)
			})
			t.Run("control", func(t *testing.T) {
				r := prewarmRig(t)
				took := r.splitTimed(t, "a first request to a new prefiller", path.whole)
				t.Logf("first request without warm-up %v", took)
				assert.GreaterOrEqual(t, took, handshakeDelay, "the first request pays the handshake")
				assert.Equal(t, 1.0, r.decode.Metric(t, "sim_kv_handshakes_total", nil))
				assert.Equal(t, 0.0, r.scMetric(t, "pd_sidecar_prewarms_total", nil), "no warm-up without --prefill-prewarm")
			})
		})
	}
}
