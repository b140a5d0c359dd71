package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// The lane serves a P/D request as the fasthttp path does: both run the
// same split machine. TestLaneSplitAnswersAsTheServer runs every outcome
// of a split twice, on rigs of their own: once sent whole (the lane's),
// once with its head in two writes (fasthttp's), and requires the same
// answer and the same counts, on the sidecar and on both engines.

// splitCountered are the sidecar's families whose every series must read
// the same after the request on either path (histograms: their counts).
var splitCountered = []string{
	"pd_sidecar_requests_total", "pd_sidecar_fallbacks_total", "pd_sidecar_prefill_retries_total",
	"pd_sidecar_kv_load_failures_total", "pd_sidecar_client_disconnects_total",
	"pd_sidecar_ttft_seconds", "pd_sidecar_prefill_duration_seconds", "pd_sidecar_kv_transfer_duration_seconds",
	"pd_sidecar_inflight_requests", "pd_sidecar_prefiller_circuits_open", "pd_sidecar_kv_releases_total",
}

// engineCountered are the engines' counters that show what work was done.
var engineCountered = []string{
	"sim_remote_kv_decodes_total", "sim_remote_decode_prefills_total", "sim_faults_injected_total",
	"vllm:prompt_tokens_total", "vllm:generation_tokens_total",
}

// series flattens families of m into "name{labels} value" lines, sorted.
func series(m harness.Metrics, families []string) []string {
	var out []string
	for _, name := range families {
		fam, ok := m[name]
		if !ok {
			continue
		}
		for _, s := range fam.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				if l.GetName() == "prefiller" {
					continue // the rig's own address
				}
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			var v float64
			switch {
			case s.Counter != nil:
				v = s.GetCounter().GetValue()
			case s.Gauge != nil:
				v = s.GetGauge().GetValue()
			case s.Histogram != nil:
				v = float64(s.GetHistogram().GetSampleCount())
			}
			out = append(out, fmt.Sprintf("%s{%s} %g", name, strings.Join(labels, ","), v))
		}
	}
	sort.Strings(out)
	return out
}

// splitOutcome is what a client and the counters saw of one request.
type splitOutcome struct {
	status  int
	answer  string // the tokens; or the error's code and type; or the stream's text and end
	sidecar []string
	prefill []string
	decode  []string
}

func TestLaneSplitAnswersAsTheServer(t *testing.T) {
	completion := completionBody(`,"max_tokens":6`)
	stream := chatBody(`,"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}`)
	for _, tc := range []struct {
		name           string
		flags          []string
		prefillFault   string
		decodeFault    string
		path, body     string
		prefiller      string // "" : the rig's
		status         int
		lane           float64 // requests the lane served when sent whole
		remoteDecodes  float64 // decodes on the prefiller's KV that succeeded
		fallbackReason string
		leave          time.Duration // the client hangs up after this long (no answer: status 0)
		leftIn         string        // the phase its leaving is counted in ("": prefill)
		// releases: the request ended with its prefill's KV unread, so a
		// release leg was sent (--release-kv-on-cancel); when it read the
		// KV it is among remoteDecodes.
		releases float64
	}{
		{name: "split", path: "/v1/completions", body: completion, status: 200, lane: 1, remoteDecodes: 1},
		{name: "split stream", path: "/v1/chat/completions", body: stream, status: 200, lane: 1, remoteDecodes: 1},
		{name: "prefiller 500 falls back", prefillFault: `{"status":500}`, path: "/v1/completions", body: completion,
			status: 200, lane: 1, fallbackReason: "server_error"},
		{name: "prefiller 429 falls back", prefillFault: `{"status":429}`, path: "/v1/chat/completions", body: stream,
			status: 200, lane: 1, fallbackReason: "overloaded"},
		{name: "prefiller refuses falls back", prefillFault: `{"refuse":true}`, path: "/v1/completions", body: completion,
			status: 200, lane: 1, fallbackReason: "unreachable"},
		{name: "prefiller hangs times out", flags: []string{"--prefill-timeout", "300ms"}, prefillFault: `{"hang":true}`,
			path: "/v1/completions", body: completion, status: 200, lane: 1, fallbackReason: "timeout"},
		{name: "prefiller 400 passed on", prefillFault: `{"status":400}`, path: "/v1/completions", body: completion,
			status: 400, lane: 1},
		{name: "retried then split", flags: []string{"--prefill-max-retries", "2", "--prefill-retry-backoff", "10ms"},
			prefillFault: `{"status":503,"times":1}`, path: "/v1/completions", body: completion, status: 200, lane: 1, remoteDecodes: 1},
		{name: "split stream held across reads", decodeFault: `{"after_head_ms":50,"only":"decode"}`,
			path: "/v1/chat/completions", body: stream, status: 200, lane: 1, remoteDecodes: 1},
		{name: "kv load failure after the stream's head recovers locally",
			decodeFault: `{"fail_kv_load":true,"after_head_ms":50,"only":"decode","times":1}`,
			path:        "/v1/chat/completions", body: stream, status: 200, lane: 1, fallbackReason: "kv_load_failed"},
		{name: "decode engine silent after its head times out", flags: []string{"--decode-first-byte-timeout", "300ms"},
			decodeFault: `{"after_head_ms":2000,"only":"decode"}`, path: "/v1/chat/completions", body: stream, status: 504, lane: 1,
			releases: 1, remoteDecodes: 1},
		{name: "client leaves while the decode stream is held", decodeFault: `{"after_head_ms":2000,"only":"decode"}`,
			path: "/v1/chat/completions", body: stream, status: 0, lane: 1, leave: 300 * time.Millisecond, leftIn: "decode",
			releases: 1, remoteDecodes: 1},
		{name: "kv load failure recovers locally", decodeFault: `{"fail_kv_load":true,"only":"decode","times":1}`,
			path: "/v1/completions", body: completion, status: 200, lane: 1, fallbackReason: "kv_load_failed"},
		{name: "kv load failure in a stream recovers locally", decodeFault: `{"fail_kv_load":true,"only":"decode","times":1}`,
			path: "/v1/chat/completions", body: stream, status: 200, lane: 1, fallbackReason: "kv_load_failed"},
		{name: "eos on the first token", prefillFault: `{"eos_first_token":true,"only":"prefill"}`,
			path: "/v1/chat/completions", body: stream, status: 200, lane: 1},
		{name: "bad prefiller header falls back", prefiller: "not-a-host-port", path: "/v1/completions", body: completion,
			status: 200, lane: 1, fallbackReason: "invalid_prefiller"},
		{name: "fallback off answers the error", flags: []string{"--prefill-fallback=false"}, prefillFault: `{"status":500}`,
			path: "/v1/completions", body: completion, status: 502, lane: 1},
		{name: "client leaves during the prefill", prefillFault: `{"latency_ms":2000,"only":"prefill"}`,
			path: "/v1/completions", body: completion, status: 0, lane: 1, leave: 300 * time.Millisecond},
		{name: "client leaves during the prefill's backoff", flags: []string{"--prefill-max-retries", "3", "--prefill-retry-backoff", "2s"},
			prefillFault: `{"status":503,"times":1}`, path: "/v1/chat/completions", body: stream, status: 0, lane: 1, leave: 300 * time.Millisecond},
		{name: "decode engine resets", decodeFault: `{"refuse":true,"only":"decode"}`, path: "/v1/completions", body: completion,
			status: 502, lane: 1, remoteDecodes: 0, releases: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(whole bool) splitOutcome {
				rig := newRig(t, tc.flags...)
				if tc.prefillFault != "" {
					setFault(t, rig.prefill, tc.prefillFault)
				}
				if tc.decodeFault != "" {
					setFault(t, rig.decode, tc.decodeFault)
				}
				hdr := rig.header()
				if tc.prefiller != "" {
					hdr = map[string]string{"x-prefiller-host-port": tc.prefiller}
				}
				o := sendRaw(t, rig.sc.Port, tc.path, tc.body, hdr, whole, tc.leave)
				lane := 0.0
				if whole {
					lane = tc.lane
				}
				harness.Eventually(t, 30*time.Second, "the request ended, the upstreams' work with it", func() bool {
					return rig.scMetric(t, "pd_sidecar_inflight_requests", nil) == 0 && running(t, rig.prefill) == 0 &&
						running(t, rig.decode) == 0 && rig.scMetric(t, "pd_sidecar_kv_releases_total", nil) == tc.releases
				})
				assert.Equal(t, lane, rig.scMetric(t, laneRequests, nil), "the lane's requests (whole: %v)", whole)
				o.sidecar = series(harness.Scrape(t, rig.sc.URL()+"/metrics"), splitCountered)
				o.prefill = series(harness.Scrape(t, rig.prefill.URL()+"/metrics"), engineCountered)
				o.decode = series(harness.Scrape(t, rig.decode.URL()+"/metrics"), engineCountered)
				assert.Equal(t, tc.remoteDecodes, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil), "decoded on remote KV (whole: %v)", whole)
				if tc.leave > 0 {
					phase := tc.leftIn
					if phase == "" {
						phase = "prefill"
					}
					assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_client_disconnects_total", map[string]string{"phase": phase}), "whole: %v", whole)
					assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"code": "499"}), "whole: %v", whole)
				}
				if tc.fallbackReason != "" {
					assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": tc.fallbackReason}))
				}
				return o
			}
			lane, server := run(true), run(false)
			require.Equal(t, tc.status, server.status, "fasthttp's answer: %s", server.answer)
			assert.Equal(t, server.status, lane.status, "status")
			assert.Equal(t, server.answer, lane.answer, "answer")
			assert.Equal(t, server.sidecar, lane.sidecar, "the sidecar's counts")
			assert.Equal(t, server.prefill, lane.prefill, "the prefiller's counts")
			assert.Equal(t, server.decode, lane.decode, "the decode engine's counts")
		})
	}
}

// sendRaw sends a request on a connection of its own: whole in one write
// (the lane's), or its head in two writes (fasthttp's); and reads the
// answer, or hangs up after leave.
func sendRaw(t *testing.T, port int, path, body string, headers map[string]string, whole bool, leave time.Duration) splitOutcome {
	t.Helper()
	conn := postRaw(t, port, path, body, headers, whole)
	defer conn.Close() // the client leaves now, not when the test ends
	if leave > 0 {
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(leave)))
		_, err := conn.Read(make([]byte, 1))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "no answer before the client leaves")
		return splitOutcome{}
	}
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return splitOutcome{status: resp.StatusCode, answer: answerOf(b)}
}

// answerOf is what of an answer must not differ between the paths: the
// tokens of a JSON answer or a stream (with how the stream ended), or an
// error's code and type.
func answerOf(b []byte) string {
	if e := gjson.GetBytes(b, "error"); e.Exists() {
		return "error " + e.Get("code").Raw + " " + e.Get("type").String()
	}
	if !strings.HasPrefix(string(b), "data:") {
		return textOf(b)
	}
	var text strings.Builder
	last := ""
	for _, line := range strings.Split(string(b), "\n") {
		d, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if !ok {
			continue
		}
		text.WriteString(gjson.Get(d, "choices.0.delta.content").String())
		last = d
		if gjson.Get(d, "error").Exists() {
			last = "error"
		}
	}
	return text.String() + " | " + last
}
