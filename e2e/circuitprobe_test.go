package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/status"
)

// TestCircuitProbeResumesSplits kills the prefiller under a stream of split
// requests until its circuit opens, starts it again on the same port, and
// requires a split well inside the cool-down (30 s of its return, the
// cool-down being a minute) while one request is sent about every 50 ms: the
// sidecar's connect probe (--circuit-probe-interval, 250ms by default) ends
// the cool-down, so nothing else could. Once on each serving path: requests sent whole (the lane's) and
// with their head in two writes (fasthttp's).
func TestCircuitProbeResumesSplits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		whole bool
	}{{"lane", true}, {"fasthttp", false}} {
		t.Run(tc.name, func(t *testing.T) {
			port, kvPort, bootPort := harness.FreePort(t), harness.FreePort(t), harness.FreePort(t)
			startPrefill := func() *harness.Engine {
				return harness.StartEngineSim(t, "prefill", "--port", itoa(port), "--kv-port", itoa(kvPort), "--bootstrap-port", itoa(bootPort))
			}
			prefill := startPrefill()
			decode := harness.StartEngineSim(t, "decode")
			sc := harness.StartSidecar(t, decode.Port, "--circuit-breaker-failures", "2", "--circuit-breaker-cooldown", "1m")
			hdr := map[string]string{"x-prefiller-host-port": prefill.HostPort()}
			body := completionBody(`,"max_tokens":6`)
			send := func() []byte {
				t.Helper()
				resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, hdr, tc.whole)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
				return b
			}
			metric := func(name string, labels map[string]string) float64 { return sc.Metric(t, name, labels) }
			split := map[string]string{"mode": "disaggregated", "code": "200"}

			want := textOf(send())
			require.Equal(t, 1.0, prefill.Metric(t, "sim_remote_decode_prefills_total", nil), "split before the kill")

			prefill.Kill()
			for i := 0; metric("pd_sidecar_fallbacks_total", map[string]string{"reason": "circuit_open"}) == 0; i++ {
				require.Less(t, i, 10, "the circuit did not open")
				assert.Equal(t, want, textOf(send()), "a local prefill, token-exact")
			}
			assert.Equal(t, 2.0, metric("pd_sidecar_fallbacks_total", map[string]string{"reason": "unreachable"}), "two refused attempts opened it")
			assert.Equal(t, 1.0, metric("pd_sidecar_prefiller_circuits_open", nil))
			harness.Eventually(t, 30*time.Second, "the open circuit is probed, and found down", func() bool {
				return metric("pd_sidecar_circuit_probes_total", map[string]string{"result": "down"}) >= 1
			})
			snap, err := status.Fetch(context.Background(), nil, sc.URL())
			require.NoError(t, err)
			var row *status.Prefiller
			for i := range snap.Prefillers {
				if snap.Prefillers[i].Prefiller == prefill.HostPort() {
					row = &snap.Prefillers[i]
				}
			}
			require.NotNil(t, row, "%+v", snap.Prefillers)
			assert.Equal(t, "open (probing)", row.Circuit)
			assert.NotNil(t, row.CircuitLastProbe, "the status view says when it was last probed")
			assert.Equal(t, 0.0, metric("pd_sidecar_circuit_probes_total", map[string]string{"result": "up"}))

			lane, splits := metric(laneRequests, nil), metric("pd_sidecar_requests_total", split)
			startedAt := time.Now()
			prefill = startPrefill()
			back := time.Now() // it answers /health again
			var took time.Duration
			for sent := 0; ; sent++ {
				require.Less(t, time.Since(back), 30*time.Second, "no split in %d requests since the prefiller's return", sent)
				b := send()
				took = time.Since(back)
				if prefill.Metric(t, "sim_remote_decode_prefills_total", nil) >= 1 {
					break
				}
				assert.Equal(t, want, textOf(b), "a local prefill, token-exact")
				if tc.whole {
					time.Sleep(50 * time.Millisecond) // fasthttp's requests take 50 ms to write
				}
			}
			t.Logf("first split %v after the prefiller answered /health again (%v after it was started)", took, time.Since(startedAt))
			assert.Less(t, took, 30*time.Second, "splits resume well inside the 1 m cool-down: the probe ended it")
			harness.Eventually(t, 30*time.Second, "the split is counted by the sidecar", func() bool {
				return metric("pd_sidecar_requests_total", split) > splits
			})
			assert.GreaterOrEqual(t, metric("pd_sidecar_circuit_probes_total", map[string]string{"result": "up"}), 1.0)
			assert.Equal(t, 0.0, metric("pd_sidecar_prefiller_circuits_open", nil), "the trial closed the circuit")
			if tc.whole {
				assert.Greater(t, metric(laneRequests, nil), lane, "served on the lane")
			} else {
				assert.Equal(t, lane, metric(laneRequests, nil), "served by fasthttp, not the lane")
			}
			assert.Equal(t, want, textOf(send()), "and the next is split too")
			assert.Equal(t, 2.0, prefill.Metric(t, "sim_remote_decode_prefills_total", nil))
		})
	}
}
