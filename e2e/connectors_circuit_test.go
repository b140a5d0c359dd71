package e2e

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestConnectorsCircuitBreaker: under every connector but nixlv2 (covered
// by the guard tests), a dead prefiller
// costs --circuit-breaker-failures failed attempts, then its circuit opens
// and further requests go straight to local prefill, token-exact.
func TestConnectorsCircuitBreaker(t *testing.T) {
	for _, spec := range connSpecs {
		t.Run(spec.name, func(t *testing.T) {
			r := newConnRig(t, spec, []string{"--circuit-breaker-failures", "2", "--circuit-breaker-cooldown", "1m"})
			// No cache_hit_threshold: shared-storage then runs prefill →
			// decode for every request (decode first would be served from
			// the store after the first local run and never reach the
			// prefiller).
			body := completionBody(`,"max_tokens":6`)
			want := r.refText(t, "/v1/completions", body)
			dead := map[string]string{"x-prefiller-host-port": harness.HostPort(harness.FreePort(t))}
			for range 5 {
				st, got, _ := scPost(t, r.sc.URL()+"/v1/completions", body, dead)
				require.Equal(t, http.StatusOK, st, "%s", got)
				assert.Equal(t, want, textOf(got))
			}
			failed := r.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "unreachable"}) +
				r.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "bootstrap_failed"})
			assert.Equal(t, 2.0, failed, "two real attempts opened the circuit")
			assert.Equal(t, 3.0, r.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "circuit_open"}))
			assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_prefiller_circuits_open", nil))
			assert.Equal(t, 5.0, r.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "fallback", "code": "200"}))
		})
	}
}
