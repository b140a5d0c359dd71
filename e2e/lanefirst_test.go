package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// The lane runs a decode-first attempt (shared-storage with
// cache_hit_threshold) with the machine fasthttp's path runs.
// TestLaneDecodeFirstAnswersAsTheServer runs every outcome of one twice,
// on rigs of their own, as TestLaneSplitAnswersAsTheServer does: sent
// whole (the lane's) and with its head in two writes (fasthttp's); the
// answers and the counts, on the sidecar and on both engines, must be the
// same, and the store's counters must show where the KV came from.

// firstCountered are the engines' counters of a decode-first attempt's
// work, on top of engineCountered.
var firstCountered = []string{"sim_shared_storage_stored_blocks_total", "sim_shared_storage_loads_total", "sim_local_prefill_tokens_total"}

func TestLaneDecodeFirstAnswersAsTheServer(t *testing.T) {
	completion := completionBody(`,"max_tokens":6,"cache_hit_threshold":0.8`)
	stream := chatBody(`,"max_tokens":6,"stream":true,"stream_options":{"include_usage":true},"cache_hit_threshold":0.8`)
	for _, tc := range []struct {
		name         string
		flags        []string
		primed       bool // the same request ran once before (fasthttp's), so the store holds its KV
		prefillFault string
		decodeFault  string
		path, body   string
		status       int
		outcome      string        // pd_sidecar_decode_first_total's outcome of the request ("": not tried)
		loads        float64       // KV loads from the store by the decode engine, the priming's included
		leave        time.Duration // the client hangs up after this long (no answer: status 0)
	}{
		{name: "declined then split", path: "/v1/completions", body: completion, status: 200, outcome: "declined", loads: 1},
		{name: "declined then split, streamed", path: "/v1/chat/completions", body: stream, status: 200, outcome: "declined", loads: 1},
		{name: "served from the store", primed: true, path: "/v1/completions", body: completion, status: 200, outcome: "served", loads: 2},
		{name: "served from the store, streamed", primed: true, path: "/v1/chat/completions", body: stream, status: 200, outcome: "served", loads: 2},
		{name: "not tried first", path: "/v1/completions", body: completionBody(`,"max_tokens":6`), status: 200, loads: 1},
		{name: "declined, the prefiller refuses, local prefill", prefillFault: `{"refuse":true}`, path: "/v1/completions", body: completion,
			status: 200, outcome: "declined"},
		{name: "decode engine refuses", decodeFault: `{"refuse":true}`, path: "/v1/completions", body: completion, status: 502},
		{name: "decode engine silent after its head", flags: []string{"--decode-first-byte-timeout", "300ms"},
			decodeFault: `{"after_head_ms":60000}`, path: "/v1/chat/completions", body: stream, status: 504},
		{name: "client leaves during the decode-first leg", decodeFault: `{"latency_ms":3000}`, path: "/v1/chat/completions", body: stream,
			leave: 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(whole bool) splitOutcome {
				rig := newConnRig(t, connSpecs[2], tc.flags)
				if tc.primed {
					o := sendRaw(t, rig.sc.Port, tc.path, tc.body, rig.header(), false, 0)
					require.Equal(t, 200, o.status, "the priming request: %s", o.answer)
				}
				if tc.prefillFault != "" {
					setFault(t, rig.prefill, tc.prefillFault)
				}
				if tc.decodeFault != "" {
					setFault(t, rig.decode, tc.decodeFault)
				}
				lane := rig.scMetric(t, laneRequests, nil)
				o := sendRaw(t, rig.sc.Port, tc.path, tc.body, rig.header(), whole, tc.leave)
				harness.Eventually(t, 30*time.Second, "the request ended, the upstreams' work with it", func() bool {
					return rig.scMetric(t, "pd_sidecar_inflight_requests", nil) == 0 && running(t, rig.prefill) == 0 && running(t, rig.decode) == 0
				})
				if whole {
					lane++
				}
				assert.Equal(t, lane, rig.scMetric(t, laneRequests, nil), "the lane's requests (whole: %v)", whole)
				o.sidecar = series(harness.Scrape(t, rig.sc.URL()+"/metrics"), append([]string{"pd_sidecar_decode_first_total"}, splitCountered...))
				o.prefill = series(harness.Scrape(t, rig.prefill.URL()+"/metrics"), append(firstCountered, engineCountered...))
				o.decode = series(harness.Scrape(t, rig.decode.URL()+"/metrics"), append(firstCountered, engineCountered...))
				if tc.outcome != "" {
					assert.Positive(t, rig.scMetric(t, "pd_sidecar_decode_first_total", map[string]string{"outcome": tc.outcome}), "whole: %v", whole)
				}
				assert.Equal(t, tc.loads, rig.decode.Metric(t, "sim_shared_storage_loads_total", nil), "KV loaded from the store (whole: %v)", whole)
				if tc.leave > 0 {
					assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_client_disconnects_total", nil), "whole: %v", whole)
				}
				return o
			}
			lane, server := run(true), run(false)
			assertSameOutcome(t, tc.status, lane, server)
		})
	}
}
