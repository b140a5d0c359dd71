package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// The lane runs the sidecar's own KV pull (--kv-connector sidecar) as
// fasthttp's path does: the pull off the loop, the split's decisions the
// machine's. TestLaneKVPullAnswersAsTheServer runs its outcomes twice, on
// rigs of their own: sent whole (the lane's) and with its head in two
// writes (fasthttp's); the answers and the counts, on the sidecar and on
// both engines, must be the same.

// kvPullCountered are the counters of the pull's work, on top of
// splitCountered and engineCountered.
var kvPullCountered = []string{
	"pd_sidecar_kv_pull_failures_total", "pd_sidecar_kv_pull_duration_seconds",
	"sim_kv_preloaded_decodes_total", "sim_kv_allocs_total", "sim_kv_frees_total", "kvtransfer_agent_releases_total",
}

func TestLaneKVPullAnswersAsTheServer(t *testing.T) {
	completion := tokenPrompt(200, 6, "")
	stream := chatBody(`,"max_tokens":6,"stream":true`)
	for _, tc := range []struct {
		name           string
		flags          []string
		prefillFault   string
		path, body     string
		status         int
		preloaded      float64 // decodes from the pulled blocks
		fallbackReason string
	}{
		{name: "pulled", path: "/v1/completions", body: completion, status: 200, preloaded: 1},
		{name: "pulled, streamed", path: "/v1/chat/completions", body: stream, status: 200, preloaded: 1},
		{name: "corrupted block: local prefill", prefillFault: `{"corrupt_kv":true,"only":"prefill","times":1}`,
			path: "/v1/completions", body: completion, status: 200, fallbackReason: "kv_load_failed"},
		{name: "expired hold: local prefill", prefillFault: `{"expire_kv":true,"only":"prefill","times":1}`,
			path: "/v1/chat/completions", body: stream, status: 200, fallbackReason: "kv_load_failed"},
		{name: "corrupted block, failure passed on", flags: []string{"--on-kv-load-failure", "error"},
			prefillFault: `{"corrupt_kv":true,"only":"prefill","times":1}`, path: "/v1/completions", body: completion, status: 500},
		{name: "prefiller 500: local prefill", prefillFault: `{"status":500}`, path: "/v1/completions", body: completion,
			status: 200, fallbackReason: "server_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(whole bool) splitOutcome {
				e := startKVEngines(t, "tcp")
				sc := e.sidecar(t, tc.flags...)
				if tc.prefillFault != "" {
					setFault(t, e.prefill, tc.prefillFault)
				}
				o := sendRaw(t, sc.Port, tc.path, tc.body, e.header(), whole, 0)
				harness.Eventually(t, 30*time.Second, "the request ended, nothing held", func() bool {
					return sc.Metric(t, "pd_sidecar_inflight_requests", nil) == 0 && running(t, e.prefill) == 0 && running(t, e.decode) == 0 &&
						e.prefill.Metric(t, "kvtransfer_agent_held_blocks", nil) == 0 && e.decode.Metric(t, "sim_kv_blocks_held", nil) == 0
				})
				assertServedBy(t, whole, sc.Metric(t, laneRequests, nil))
				assert.Equal(t, tc.preloaded, e.decode.Metric(t, "sim_kv_preloaded_decodes_total", nil), "decoded from pulled blocks (whole: %v)", whole)
				if tc.fallbackReason != "" {
					assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": tc.fallbackReason}), "whole: %v", whole)
				}
				o.sidecar = series(harness.Scrape(t, sc.URL()+"/metrics"), append(kvPullCountered, splitCountered...))
				o.prefill = series(harness.Scrape(t, e.prefill.URL()+"/metrics"), append(kvPullCountered, engineCountered...))
				o.decode = series(harness.Scrape(t, e.decode.URL()+"/metrics"), append(kvPullCountered, engineCountered...))
				return o
			}
			lane, server := run(true), run(false)
			assertSameOutcome(t, tc.status, lane, server)
		})
	}
}
