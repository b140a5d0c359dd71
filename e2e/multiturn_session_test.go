package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestMultiturnSessionHeaderConsumed: with --enable-bidirectional-kv-xfer
// the session header is the sidecar's, as the body's conversation_id is:
// no leg carries it — a local request's, a split's prefill and decode legs,
// a declined split's, a fallback's — whatever its letter case and whether
// or not the key is one the feature takes (a key with a space names no
// session). With the feature off the header is not the sidecar's, and
// every leg carries it as before (llm-d's endpoint picker sets
// x-session-token for its own session affinity). The engines are fakes on
// raw TCP that record every leg's head. On the lane (its requests counted)
// and on fasthttp's path.
func TestMultiturnSessionHeaderConsumed(t *testing.T) {
	long := strings.Repeat("word ", 1000) // past --min-remote-prefill-tokens: split
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			local := startLegEngine(t, func(_ *http.Request, body []byte) string {
				return completionAnswer(gjson.GetBytes(body, "stream").Bool(), "", "")
			})
			prefiller := startLegEngine(t, func(*http.Request, []byte) string {
				return prefillAnswer(nixlParams("127.0.0.1", 5600, ""))
			})
			dead := harness.FreePort(t) // nothing listens: the split falls back
			cases := []struct {
				name, prompt, prefiller string
				key                     string
				stream                  bool
				prefills                int
			}{
				{"local", "hello", "", "conv-1", false, 0},
				{"local, streamed", "hello", "", "conv-1", true, 0},
				{"split", long, prefiller.Addr(), "conv-2", false, 1},
				{"split, streamed", long, prefiller.Addr(), "conv-2", true, 1},
				{"split declined (short prompt)", "hello", prefiller.Addr(), "conv-3", false, 0},
				{"fallback", long, harness.HostPort(dead), "conv-4", false, 0},
				{"a key that names no session", long, prefiller.Addr(), "not a key", false, 1},
			}
			for _, on := range []bool{true, false} {
				flags := append([]string{"--min-remote-prefill-tokens", "1000"}, mode.flags...)
				if on {
					flags = append(flags, "--enable-bidirectional-kv-xfer")
				}
				sc := harness.StartSidecar(t, local.Port(), flags...)
				onLoops := sc.Metric(t, "pd_sidecar_loop_requests_total", nil)
				for _, tc := range cases {
					what := fmt.Sprintf("%s (feature on: %v)", tc.name, on)
					headers := map[string]string{"X-Session-TOKEN": tc.key, "X-Client-Kept": "c"}
					if tc.prefiller != "" {
						headers["x-prefiller-host-port"] = tc.prefiller
					}
					body := fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":4,"stream":%v}`, tc.prompt, tc.stream)
					resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, headers, mode.lane)
					require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", what, b)
					legs := local.take()
					require.Len(t, legs, 1, "%s: one local leg", what)
					pre := prefiller.take()
					require.Len(t, pre, tc.prefills, "%s: prefill legs", what)
					if tc.prefills > 0 {
						assert.Equal(t, "evil", gjson.GetBytes(legs[0].body, "kv_transfer_params.remote_engine_id").String(), "%s: the decode leg carries the prefill's handoff", what)
					}
					for _, l := range append(legs, pre...) {
						assert.Equal(t, "c", l.header.Get("X-Client-Kept"), "%s: the client's other fields pass", what)
						if on {
							assert.Empty(t, l.header.Values("X-Session-Token"), "%s: a leg carried the session key: %v", what, l.header)
						} else {
							assert.Equal(t, []string{tc.key}, l.header.Values("X-Session-Token"), "%s: the feature is off: the header is not the sidecar's", what)
						}
					}
				}
				if mode.lane {
					assert.Equal(t, onLoops+float64(len(cases)), sc.Metric(t, "pd_sidecar_loop_requests_total", nil), "the lane served them")
				}
				declined := sc.Metric(t, "pd_sidecar_split_declined_total", map[string]string{"reason": "short_prompt"})
				assert.Equal(t, 1.0, declined, "one split declined")
			}
		})
	}
}
