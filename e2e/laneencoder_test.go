package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// The lane serves requests with an encoder stage (x-encoder-hosts-ports
// with --ec-connector): their admission, whose fan-out to the encoders
// waits on upstream I/O, runs off the loop, the rest of the request on it.
// TestLaneEncoderStageAnswersAsTheServer runs the stage's outcomes twice,
// on rigs of their own, sent whole (the lane's) and with its head in two
// writes (fasthttp's), and requires the same answers and counts, on the
// sidecar and on every engine, the encoders' output proven used by the
// engines' counters.

// encoderCountered are the counters of the stage's work. Not compared:
// pd_sidecar_encoder_failures_total and the legs' durations. Under
// --on-encoder-failure error the first failed leg ends the stage and
// cancels the others, so how many more failed first is timing, not the
// driver; the test requires a failure of the expected reason instead.
var encoderCountered = []string{
	"pd_sidecar_encoder_stages_total", "pd_sidecar_encoder_items_total",
	"sim_ec_encodes_total", "sim_ec_loaded_items_total", "sim_ec_local_encodes_total",
}

func TestLaneEncoderStageAnswersAsTheServer(t *testing.T) {
	body := mmChatBody(threeImages...)
	streamed := strings.Replace(body, `"max_tokens":6`, `"max_tokens":6,"stream":true`, 1)
	for _, tc := range []struct {
		name         string
		flags        []string
		split        bool   // a prefiller is named too (E/P/D)
		encoderFault string // "down": nothing listens at the encoder's address
		body         string
		status       int
		remoteItems  float64       // items the decode engine loaded from the encoder
		failReason   string        // the reason of the encoder legs' failures
		leave        time.Duration // the client hangs up after this long (no answer: status 0)
	}{
		{name: "E/PD", body: body, status: 200, remoteItems: 3},
		{name: "E/PD streamed", body: streamed, status: 200, remoteItems: 3},
		{name: "E/P/D", split: true, body: body, status: 200, remoteItems: 3},
		{name: "E/P/D streamed", split: true, body: streamed, status: 200, remoteItems: 3},
		{name: "encoder down: error", encoderFault: "down", body: body, status: 502, failReason: "unreachable"},
		{name: "encoder down: local encode", flags: []string{"--on-encoder-failure", "local"}, encoderFault: "down", body: body,
			status: 200, failReason: "unreachable"},
		{name: "encoder slow: timeout", flags: []string{"--encoder-timeout", "300ms"}, encoderFault: `{"latency_ms":60000}`, body: body,
			status: 502, failReason: "timeout"},
		{name: "client leaves during the stage", encoderFault: `{"latency_ms":60000}`, body: body, leave: 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(whole bool) splitOutcome {
				enc := harness.StartEngineSim(t, "encode")
				encAddr := enc.HostPort()
				switch tc.encoderFault {
				case "":
				case "down":
					encAddr = "127.0.0.1:" + itoa(harness.FreePort(t))
				default:
					setFault(t, enc, tc.encoderFault)
				}
				rig := &pdRig{prefill: harness.StartEngineSim(t, "prefill"), decode: harness.StartEngineSim(t, "decode")}
				if !tc.split {
					rig.decode = harness.StartEngineSim(t, "both")
				}
				rig.sc = harness.StartSidecar(t, rig.decode.Port, append([]string{"--ec-connector", "ec-nixl"}, tc.flags...)...)
				hdr := map[string]string{"x-encoder-hosts-ports": encAddr}
				if tc.split {
					hdr["x-prefiller-host-port"] = rig.prefill.HostPort()
				}
				o := sendRaw(t, rig.sc.Port, "/v1/chat/completions", tc.body, hdr, whole, tc.leave)
				harness.Eventually(t, 30*time.Second, "the request ended, the upstreams' work with it", func() bool {
					return rig.scMetric(t, "pd_sidecar_inflight_requests", nil) == 0 && running(t, rig.prefill) == 0 && running(t, rig.decode) == 0
				})
				assertServedBy(t, whole, rig.scMetric(t, laneRequests, nil))
				assert.Equal(t, tc.remoteItems, rig.decode.Metric(t, "sim_ec_loaded_items_total", map[string]string{"source": "remote"}),
					"items the decode engine loaded from the encoder (whole: %v)", whole)
				if tc.split {
					assert.Equal(t, 1.0, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil), "decoded on the prefiller's KV (whole: %v)", whole)
				}
				if tc.leave > 0 {
					assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_client_disconnects_total", nil), "whole: %v", whole)
				}
				if tc.failReason != "" {
					assert.Positive(t, rig.scMetric(t, "pd_sidecar_encoder_failures_total", map[string]string{"reason": tc.failReason}), "whole: %v", whole)
				}
				o.sidecar = series(harness.Scrape(t, rig.sc.URL()+"/metrics"), append(encoderCountered, splitCountered...))
				o.prefill = series(harness.Scrape(t, rig.prefill.URL()+"/metrics"), append(encoderCountered, engineCountered...))
				o.decode = series(harness.Scrape(t, rig.decode.URL()+"/metrics"), append(encoderCountered, engineCountered...))
				return o
			}
			lane, server := run(true), run(false)
			assertSameOutcome(t, tc.status, lane, server)
		})
	}
}
