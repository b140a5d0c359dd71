package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/status"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

// TestResponsesPreviousResponseServedByDecode: a /v1/responses
// conversation whose history the engine holds (previous_response_id), on
// the lane and on fasthttp's path. Turn 1 names the prefiller and is
// split (the prefiller prefilled, the decoder decoded on its KV); the
// decode engine keeps the answer. Turn 2 names turn 1's answer and the
// prefiller: the split is declined (split_declined_total{reason=
// "previous_response"}), the prefiller sees no request, and the decode
// engine answers from the history it holds — the answer a decode engine
// of the same configuration gives when sent the same two turns directly.
// Turn 3 names no prefiller and is served the same way, not counted as
// declined. An id no engine holds is the decode engine's 404 error body,
// as vLLM writes it (the corpus's shape), with or without the prefiller,
// JSON even for a stream.
func TestResponsesPreviousResponseServedByDecode(t *testing.T) {
	shape, err := wirecorpus.Get("vllm-responses-unknown-previous-4d89a999")
	require.NoError(t, err)
	notFound := func(id string) map[string]any {
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(strings.ReplaceAll(string(shape.Value), "resp_unknown", id)), &v))
		return v
	}
	turn := func(input, prev, extra string) string {
		b := `{"model":"sim-model","input":` + quote(input) + `,"max_output_tokens":8` + extra
		if prev != "" {
			b += `,"previous_response_id":` + quote(prev)
		}
		return b + "}"
	}
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			prefill := harness.StartEngineSim(t, "prefill")
			decode := harness.StartEngineSim(t, "decode")
			ref := harness.StartEngineSim(t, "decode") // the decode engine alone, sent the turns directly
			sc := harness.StartSidecar(t, decode.Port, mode.flags...)
			split := map[string]string{"x-prefiller-host-port": prefill.HostPort()}
			send := func(body string, headers map[string]string) (int, []byte) {
				t.Helper()
				resp, b := exchangeRaw(t, sc.Port, "/v1/responses", body, headers, mode.lane)
				harness.Eventually(t, 30*time.Second, "the request ended", func() bool {
					return sc.Metric(t, "pd_sidecar_inflight_requests", nil) == 0
				})
				return resp.StatusCode, b
			}
			direct := func(body string) []byte {
				t.Helper()
				code, b, _ := scPost(t, ref.URL()+"/v1/responses", body, nil)
				require.Equal(t, http.StatusOK, code, "%s", b)
				return b
			}
			text := func(b []byte) string { return gjson.GetBytes(b, "output.0.content.0.text").String() }
			declined := func() float64 {
				return sc.Metric(t, "pd_sidecar_split_declined_total", map[string]string{"reason": "previous_response"})
			}

			// Turn 1: split, kept by the decode engine.
			code, one := send(turn(simPrompt, "", ""), split)
			require.Equal(t, http.StatusOK, code, "%s", one)
			assert.Equal(t, 1.0, prefill.Metric(t, "sim_remote_decode_prefills_total", nil), "the prefiller prefilled turn 1")
			assert.Equal(t, 1.0, decode.Metric(t, "sim_remote_kv_decodes_total", nil), "the decoder decoded turn 1 on its KV")
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
			refOne := direct(turn(simPrompt, "", ""))
			require.Equal(t, text(refOne), text(one), "the split's answer is the decode engine's own")
			id1 := gjson.GetBytes(one, "id").String()
			require.NotEmpty(t, id1)

			// Turn 2: names turn 1's answer and the prefiller: declined.
			code, two := send(turn("And then what happened?", id1, ""), split)
			require.Equal(t, http.StatusOK, code, "%s", two)
			refTwo := direct(turn("And then what happened?", gjson.GetBytes(refOne, "id").String(), ""))
			assert.Equal(t, text(refTwo), text(two), "the decode engine answered from the history it holds")
			assert.NotEqual(t, text(direct(turn("And then what happened?", "", ""))), text(two), "the answer depends on the history")
			assert.Equal(t, 1.0, declined(), "the split declined for the engine-held conversation")
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "local", "code": "200"}))
			assert.Equal(t, 0.0, sc.Metric(t, "pd_sidecar_fallbacks_total", nil), "a decline is no fallback")
			assert.Len(t, simRequests(t, prefill), 1, "the prefiller saw turn 1 only")
			assert.Equal(t, 1.0, prefill.Metric(t, "sim_remote_decode_prefills_total", nil), "no prefill of turn 2")
			assert.Equal(t, 1.0, decode.Metric(t, "sim_previous_responses_total", map[string]string{"result": "found"}))
			assert.Contains(t, sc.Output(), "previous_response_id", "the decline logged")

			// Turn 3: no prefiller named; served the same way, no decline.
			code, three := send(turn("How did it end?", gjson.GetBytes(two, "id").String(), ""), nil)
			require.Equal(t, http.StatusOK, code, "%s", three)
			refThree := direct(turn("How did it end?", gjson.GetBytes(refTwo, "id").String(), ""))
			assert.Equal(t, text(refThree), text(three))
			assert.Equal(t, 1.0, declined(), "no prefiller named: nothing declined")

			// An id the decode engine does not hold: its 404, whole.
			for _, h := range []map[string]string{split, nil} {
				for _, extra := range []string{"", `,"stream":true`} {
					code, b := send(turn("Hello?", "resp_unknown", extra), h)
					assert.Equal(t, http.StatusNotFound, code, "%s", b)
					var got map[string]any
					require.NoError(t, json.Unmarshal(b, &got), "%s", b)
					assert.Equal(t, notFound("resp_unknown"), got)
				}
			}
			assert.Equal(t, 3.0, declined(), "the unknown ids that named the prefiller declined too")
			assert.Len(t, simRequests(t, prefill), 1, "the prefiller saw turn 1 only")

			snap, err := status.Fetch(context.Background(), nil, sc.URL())
			require.NoError(t, err)
			assert.Equal(t, map[string]int{"previous_response": 3}, snap.Window.DeclinedByReason, "shown apart in the status view")
			assert.Equal(t, 0, snap.Window.FellBack)
		})
	}
}
