package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// The lane runs a paired split (both legs at once: SGLang, Mooncake,
// MoRI-IO's parallel dispatch) with the machine fasthttp's path runs.
// TestLanePairedSplitAnswersAsTheServer runs every outcome of one twice,
// on rigs of their own, as TestLaneSplitAnswersAsTheServer does for the
// sequential split: sent whole (the lane's) and with its head in two
// writes (fasthttp's); the answers and the counts, on the sidecar and on
// both engines, must be the same, and the proof counters must show the
// split happened where it should have.

// pairedCountered are the engines' counters of a paired split's work, on
// top of engineCountered.
var pairedCountered = []string{
	"sim_sglang_prefills_total", "sim_sglang_decodes_total", "sim_mooncake_prefills_total", "sim_mooncake_decodes_total",
	"sim_moriio_decodes_total", "sim_moriio_blocks_pushed_total", "sim_moriio_blocks_used_total",
	"sim_local_prefill_tokens_total",
}

// Not compared: sim_requests_cancelled_total. Whether a leg cancelled
// early had reached its engine yet (so that the engine counts its
// cancellation) depends on timing, not on the driver; that no leg is left
// running is what the test waits for.

// pairedSidecarCountered are the sidecar's families a paired split moves,
// on top of splitCountered.
var pairedSidecarCountered = []string{"pd_sidecar_prefill_leg_failures_total", "pd_sidecar_circuit_transitions_total"}

// assertSameOutcome requires fasthttp's answer (server) to have status,
// and the lane's to be the same: status, answer, and the counts of the
// sidecar and of the engines.
func assertSameOutcome(t *testing.T, status int, lane, server splitOutcome) {
	t.Helper()
	require.Equal(t, status, server.status, "fasthttp's answer: %s", server.answer)
	assert.Equal(t, server.status, lane.status, "status")
	assert.Equal(t, server.answer, lane.answer, "answer")
	assert.Equal(t, server.sidecar, lane.sidecar, "the sidecar's counts")
	assert.Equal(t, server.prefill, lane.prefill, "the prefiller's counts")
	assert.Equal(t, server.decode, lane.decode, "the decode engine's counts")
}

// assertServedBy requires the request sent whole to have been the lane's
// (laneServed, pd_sidecar_loop_requests_total, is 1) and the one sent with
// its head in two writes fasthttp's (0).
func assertServedBy(t *testing.T, whole bool, laneServed float64) {
	t.Helper()
	want := 0.0
	if whole {
		want = 1
	}
	assert.Equal(t, want, laneServed, "the lane's requests (whole: %v)", whole)
}

func TestLanePairedSplitAnswersAsTheServer(t *testing.T) {
	completion := completionBody(`,"max_tokens":6`)
	stream := chatBody(`,"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}`)
	type pairedCase struct {
		name           string
		connector      string // sglang, mooncake, or moriio (parallel dispatch)
		flags          []string
		prefillFault   string
		decodeFault    string
		path, body     string
		status         int
		split          bool // the decode engine decoded on the prefiller's KV
		fallbackReason string
		leave          time.Duration // the client hangs up after this long (no answer: status 0)
		// prefillRaces: the prefill leg is abandoned at once, so whether it
		// reached its engine first is timing, not the driver: the
		// prefiller's counts are not compared.
		prefillRaces bool
	}
	var cases []pairedCase
	for _, c := range []string{"sglang", "mooncake"} {
		cases = append(cases,
			pairedCase{name: "split", path: "/v1/completions", body: completion, status: 200, split: true},
			pairedCase{name: "split stream", path: "/v1/chat/completions", body: stream, status: 200, split: true},
			pairedCase{name: "prefiller 500 falls back", prefillFault: `{"status":500}`, path: "/v1/chat/completions", body: stream,
				status: 200, fallbackReason: "server_error"},
			pairedCase{name: "prefiller refuses falls back", prefillFault: `{"refuse":true}`, path: "/v1/completions", body: completion,
				status: 200, fallbackReason: "unreachable"},
			pairedCase{name: "prefiller 400 passed on", prefillFault: `{"status":400}`, path: "/v1/completions", body: completion, status: 400},
			pairedCase{name: "prefiller hangs times out", flags: []string{"--prefill-timeout", "300ms"}, prefillFault: `{"hang":true}`,
				path: "/v1/completions", body: completion, status: 200, fallbackReason: "timeout"},
			pairedCase{name: "fallback off answers the error", flags: []string{"--prefill-fallback=false"}, prefillFault: `{"status":500}`,
				path: "/v1/completions", body: completion, status: 502},
			// The prefill is slow to begin, so that it never holds KV
			// nobody pulls, whether or not it reached its engine.
			pairedCase{name: "decode engine resets", prefillFault: `{"latency_ms":5000}`, decodeFault: `{"refuse":true}`,
				path: "/v1/completions", body: completion, status: 502, prefillRaces: true},
			pairedCase{name: "client leaves while the decode waits", decodeFault: `{"latency_ms":3000}`, path: "/v1/chat/completions",
				body: stream, leave: 300 * time.Millisecond},
		)
		for i := range cases {
			if cases[i].connector == "" {
				cases[i].connector = c
			}
		}
	}
	cases = append(cases,
		pairedCase{connector: "moriio", name: "split", path: "/v1/completions", body: completion, status: 200, split: true},
		pairedCase{connector: "moriio", name: "split stream", path: "/v1/chat/completions", body: stream, status: 200, split: true},
		pairedCase{connector: "moriio", name: "prefiller 500 falls back", prefillFault: `{"status":500}`, path: "/v1/chat/completions",
			body: stream, status: 200, fallbackReason: "server_error"},
		pairedCase{connector: "moriio", name: "no prefill outcome within the KV wait falls back",
			flags:        []string{"--moriio-parallel-decode-wait-timeout=400ms", "--prefill-timeout=60s"},
			prefillFault: `{"latency_ms":40000,"times":1}`, path: "/v1/chat/completions", body: stream, status: 200, fallbackReason: "kv_wait_timeout"},
		pairedCase{connector: "moriio", name: "client leaves while the prefill runs", prefillFault: `{"latency_ms":3000}`,
			path: "/v1/completions", body: completion, leave: 300 * time.Millisecond},
	)
	for _, tc := range cases {
		t.Run(tc.connector+" "+tc.name, func(t *testing.T) {
			run := func(whole bool) splitOutcome {
				var rig pdRig
				if tc.connector == "moriio" {
					rig = newMoriRig(t, append([]string{"--moriio-parallel-dispatch=true"}, tc.flags...)...).pdRig
				} else {
					rig = newConnRig(t, connSpec{name: tc.connector}, tc.flags).pdRig
				}
				if tc.prefillFault != "" {
					setFault(t, rig.prefill, tc.prefillFault)
				}
				if tc.decodeFault != "" {
					setFault(t, rig.decode, tc.decodeFault)
				}
				hdr := rig.header()
				hdr["x-request-id"] = "paired-" + tc.name // MoRI-IO's rank comes from it
				o := sendRaw(t, rig.sc.Port, tc.path, tc.body, hdr, whole, tc.leave)
				harness.Eventually(t, 30*time.Second, "the request ended, the upstreams' work with it", func() bool {
					return rig.scMetric(t, "pd_sidecar_inflight_requests", nil) == 0 && running(t, rig.prefill) == 0 &&
						running(t, rig.decode) == 0 && rig.prefill.Metric(t, "sim_kv_blocks_held", nil) == 0
				})
				assertServedBy(t, whole, rig.scMetric(t, laneRequests, nil))
				o.sidecar = series(harness.Scrape(t, rig.sc.URL()+"/metrics"), append(pairedSidecarCountered, splitCountered...))
				o.prefill = series(harness.Scrape(t, rig.prefill.URL()+"/metrics"), append(pairedCountered, engineCountered...))
				o.decode = series(harness.Scrape(t, rig.decode.URL()+"/metrics"), append(pairedCountered, engineCountered...))
				decodes := rig.decode.Metric(t, "sim_sglang_decodes_total", nil) + rig.decode.Metric(t, "sim_mooncake_decodes_total", nil) +
					rig.decode.Metric(t, "sim_moriio_decodes_total", nil)
				if tc.split {
					assert.Equal(t, 1.0, decodes, "the decode engine decoded on the prefiller's KV (whole: %v)", whole)
					assert.Zero(t, rig.decode.Metric(t, "sim_local_prefill_tokens_total", nil), "no local prefill (whole: %v)", whole)
				}
				if tc.fallbackReason != "" {
					assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": tc.fallbackReason}), "whole: %v", whole)
					assert.Positive(t, rig.decode.Metric(t, "sim_local_prefill_tokens_total", nil), "the decode engine prefilled locally (whole: %v)", whole)
				}
				if tc.leave > 0 {
					assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_client_disconnects_total", nil), "whole: %v", whole)
					assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"code": "499"}), "whole: %v", whole)
				}
				return o
			}
			lane, server := run(true), run(false)
			if tc.prefillRaces {
				lane.prefill, server.prefill = nil, nil
			}
			assertSameOutcome(t, tc.status, lane, server)
		})
	}
}
