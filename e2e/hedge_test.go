package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// Hedged prefill (--prefill-hedge-after, proxy/hedge): a prefill that
// has not answered by the hedge point is raced by a local prefill; the
// first ready wins and the other is cancelled. Every case runs on both
// serving paths (the lane: the request sent whole; fasthttp: its head cut
// across two writes) and proves who won from the engines' own counters:
// the loser's engine counts a request whose client left before its answer
// (sim_requests_cancelled_total), no KV stays held on the prefiller, and
// the decoder generated the answer's tokens once.

// answerText is the generated text of a JSON answer or an SSE stream.
func answerText(t *testing.T, b []byte) string {
	t.Helper()
	if !bytes.HasPrefix(bytes.TrimSpace(b), []byte("data:")) && !bytes.Contains(b, []byte("\ndata:")) {
		return textOf(b)
	}
	var text strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &ev) == nil && len(ev.Choices) > 0 {
			text.WriteString(ev.Choices[0].Text + ev.Choices[0].Delta.Content)
		}
	}
	require.NoError(t, sc.Err())
	return text.String()
}

// postTo posts body to path on an engine's port and returns the answer.
func postTo(t *testing.T, port int, path, body string) []byte {
	t.Helper()
	resp, b := exchangeRaw(t, port, path, body, nil, true)
	require.Equal(t, 200, resp.StatusCode, "%s", b)
	return b
}

func TestHedgedPrefill(t *testing.T) {
	chatStream := chatBody(`,"max_tokens":6,"stream":true`)
	completion := completionBody(`,"max_tokens":6`)
	for _, tc := range []struct {
		name         string
		decodeArgs   []string // the decode engine's
		prefillFault string
		flags        []string
		body, path   string
		maxTook      time.Duration // the answer's bound
		minTook      time.Duration
		winner       string // "" : no hedge
		denied       float64
		mode         string
		reason       string // fallbacks_total's
		// what the losing leg's engine saw cancelled
		cancelledPrefill, cancelledLocal float64
	}{
		{
			name:         "slow prefill, local prefill wins, stream",
			prefillFault: `{"latency_ms":60000,"only":"prefill"}`,
			flags:        []string{"--prefill-hedge-after", "100ms", "--prefill-hedge-budget", "1"},
			path:         "/v1/chat/completions", body: chatStream,
			maxTook: 30 * time.Second, winner: "local", mode: "fallback", reason: "slow_prefill", cancelledPrefill: 1,
		},
		{
			name:         "slow prefill, local prefill wins, JSON",
			prefillFault: `{"latency_ms":60000,"only":"prefill"}`,
			flags:        []string{"--prefill-hedge-after", "100ms", "--prefill-hedge-budget", "1"},
			path:         "/v1/completions", body: completion,
			maxTook: 30 * time.Second, winner: "local", mode: "fallback", reason: "slow_prefill", cancelledPrefill: 1,
		},
		{
			name:         "prefill answers while the local prefill runs, stream",
			decodeArgs:   []string{"--prefill-us-per-token", "800000"},
			prefillFault: `{"latency_ms":300,"only":"prefill"}`,
			flags:        []string{"--prefill-hedge-after", "50ms", "--prefill-hedge-budget", "1"},
			path:         "/v1/chat/completions", body: chatStream,
			maxTook: 20 * time.Second, minTook: 300 * time.Millisecond, winner: "remote", mode: "disaggregated", cancelledLocal: 1,
		},
		{
			name:         "prefill answers while the local prefill runs, JSON",
			decodeArgs:   []string{"--prefill-us-per-token", "800000"},
			prefillFault: `{"latency_ms":300,"only":"prefill"}`,
			flags:        []string{"--prefill-hedge-after", "50ms", "--prefill-hedge-budget", "1"},
			path:         "/v1/completions", body: completion,
			maxTook: 20 * time.Second, minTook: 300 * time.Millisecond, winner: "remote", mode: "disaggregated", cancelledLocal: 1,
		},
		{
			name:         "the prefill fails while hedged: the running local prefill is its fallback",
			decodeArgs:   []string{"--prefill-us-per-token", "100000"},
			prefillFault: `{"latency_ms":300,"status":500,"only":"prefill"}`,
			flags:        []string{"--prefill-hedge-after", "50ms", "--prefill-hedge-budget", "1"},
			path:         "/v1/chat/completions", body: chatStream,
			maxTook: 30 * time.Second, minTook: 500 * time.Millisecond, winner: "local", mode: "fallback", reason: "server_error",
		},
		{
			name:         "budget spent: the slow prefill is waited for",
			prefillFault: `{"latency_ms":700,"only":"prefill"}`,
			flags:        []string{"--prefill-hedge-after", "50ms", "--prefill-hedge-budget", "0"},
			path:         "/v1/completions", body: completion,
			maxTook: 30 * time.Second, minTook: 700 * time.Millisecond, denied: 1, mode: "disaggregated",
		},
	} {
		for _, whole := range []bool{true, false} {
			path := "fasthttp"
			if whole {
				path = "lane"
			}
			t.Run(tc.name+"/"+path, func(t *testing.T) {
				prefill := harness.StartEngineSim(t, "prefill")
				decode := harness.StartEngineSim(t, "decode", tc.decodeArgs...)
				sc := harness.StartSidecar(t, decode.Port, tc.flags...)
				// The reference: the same request served by the prefill
				// engine alone (the decoder's prefix cache stays cold);
				// engine-sim's tokens are a function of the KV the decode
				// reads, so every answer below must match it.
				ref := postTo(t, prefill.Port, tc.path, tc.body)
				want := answerText(t, ref)
				require.NotEmpty(t, want)
				tokens := prefill.Metric(t, "vllm:generation_tokens_total", nil)
				promptTokens := prefill.Metric(t, "vllm:prompt_tokens_total", nil)
				setFault(t, prefill, tc.prefillFault)

				start := time.Now()
				resp, b := exchangeRaw(t, sc.Port, tc.path, tc.body,
					map[string]string{"x-prefiller-host-port": prefill.HostPort()}, whole)
				took := time.Since(start)
				require.Equal(t, 200, resp.StatusCode, "%s", b)
				assert.Equal(t, want, answerText(t, b), "the answer's tokens")
				assert.LessOrEqual(t, took, tc.maxTook)
				assert.GreaterOrEqual(t, took, tc.minTook)

				m := func(name string, labels map[string]string) float64 { return sc.Metric(t, name, labels) }
				for _, w := range []string{"local", "remote"} {
					want := 0.0
					if w == tc.winner {
						want = 1
					}
					assert.Equal(t, want, m("pd_sidecar_hedges_total", map[string]string{"winner": w}), "winner %s", w)
				}
				assert.Equal(t, tc.denied, m("pd_sidecar_hedges_denied_total", nil))
				assert.Equal(t, 1.0, m("pd_sidecar_requests_total", map[string]string{"mode": tc.mode, "code": "200"}))
				if tc.reason != "" {
					assert.Equal(t, 1.0, m("pd_sidecar_fallbacks_total", map[string]string{"reason": tc.reason}))
				}
				lane := 0.0
				if whole {
					lane = 1
				}
				assert.Equal(t, lane, m("pd_sidecar_loop_requests_total", nil), "requests the lane served")

				// What the engines did: the loser was cancelled, nothing is
				// left held, and the answer's tokens were generated once.
				for _, c := range []struct {
					e          *harness.Engine
					kind, what string
					want       float64
				}{
					{prefill, "prefill", "prefills cancelled on the prefiller", tc.cancelledPrefill},
					{decode, "local", "local prefills cancelled on the decoder", tc.cancelledLocal},
				} {
					harness.Eventually(t, 30*time.Second, c.what, func() bool {
						return c.e.Metric(t, "sim_requests_cancelled_total", map[string]string{"kind": c.kind}) == c.want
					})
				}
				split := 0.0
				if tc.winner != "local" {
					split = 1
				}
				assert.Equal(t, split, prefill.Metric(t, "sim_remote_decode_prefills_total", nil), "prefills for the decoder")
				assert.Equal(t, split, decode.Metric(t, "sim_remote_kv_decodes_total", nil), "decodes on the prefiller's KV")
				if tc.winner == "local" {
					assert.Equal(t, promptTokens, decode.Metric(t, "sim_local_prefill_tokens_total", nil),
						"the decoder prefilled the prompt once")
				}
				harness.Eventually(t, 30*time.Second, "no KV held on the prefiller", func() bool {
					return prefill.Metric(t, "sim_kv_blocks_held", nil) == 0
				})
				assert.Equal(t, tokens, decode.Metric(t, "vllm:generation_tokens_total", nil),
					"the decoder generated the answer's tokens once")
			})
		}
	}
}

// TestHedgedPrefillClientLeaves: a client that leaves while both legs of a
// hedge run cancels both: each engine counts its request cancelled, and
// nothing stays held on the prefiller.
func TestHedgedPrefillClientLeaves(t *testing.T) {
	for _, whole := range []bool{true, false} {
		path := "fasthttp"
		if whole {
			path = "lane"
		}
		t.Run(path, func(t *testing.T) {
			prefill := harness.StartEngineSim(t, "prefill")
			// Both legs last a minute or more: the client leaves while both run.
			decode := harness.StartEngineSim(t, "decode", "--prefill-us-per-token", "2000000")
			sc := harness.StartSidecar(t, decode.Port, "--prefill-hedge-after", "50ms", "--prefill-hedge-budget", "1")
			setFault(t, prefill, `{"latency_ms":60000,"only":"prefill"}`)
			conn := postRaw(t, sc.Port, "/v1/chat/completions", chatBody(`,"max_tokens":6,"stream":true`),
				map[string]string{"x-prefiller-host-port": prefill.HostPort()}, whole)
			// Both legs run once the hedge started.
			harness.Eventually(t, 30*time.Second, "the hedge's local leg running", func() bool {
				return running(t, decode) == 1
			})
			require.NoError(t, conn.Close())
			for _, c := range []struct {
				e    *harness.Engine
				kind string
			}{{prefill, "prefill"}, {decode, "local"}} {
				harness.Eventually(t, 30*time.Second, c.kind+" cancelled", func() bool {
					return c.e.Metric(t, "sim_requests_cancelled_total", map[string]string{"kind": c.kind}) == 1
				})
			}
			harness.Eventually(t, 30*time.Second, "the client's leaving counted", func() bool {
				return sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "499"}) == 1
			})
			assert.Equal(t, 0.0, prefill.Metric(t, "sim_kv_blocks_held", nil))
			assert.Equal(t, 0.0, decode.Metric(t, "vllm:generation_tokens_total", nil), "no token made")
			for _, w := range []string{"local", "remote"} {
				assert.Equal(t, 0.0, sc.Metric(t, "pd_sidecar_hedges_total", map[string]string{"winner": w}), "no winner")
			}
			assert.Equal(t, 0.0, sc.Metric(t, "pd_sidecar_inflight_requests", map[string]string{"phase": "local"}), "the hedge's gauge")
		})
	}
}

// TestHedgedPrefillAuto: with --prefill-hedge-after auto no prefill is
// hedged until the prefiller's recent prefill times set its hedge point;
// then a prefill far slower than those is hedged, and the local leg wins.
func TestHedgedPrefillAuto(t *testing.T) {
	for _, whole := range []bool{true, false} {
		path := "fasthttp"
		if whole {
			path = "lane"
		}
		t.Run(path, func(t *testing.T) {
			prefill := harness.StartEngineSim(t, "prefill")
			decode := harness.StartEngineSim(t, "decode")
			sc := harness.StartSidecar(t, decode.Port, "--prefill-hedge-after", "auto", "--prefill-hedge-budget", "1")
			h := map[string]string{"x-prefiller-host-port": prefill.HostPort()}
			body := completionBody(`,"max_tokens":4`)
			// The first slow prefill comes before auto has its samples: waited for.
			setFault(t, prefill, `{"latency_ms":400,"only":"prefill","times":1}`)
			resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, h, whole)
			require.Equal(t, 200, resp.StatusCode, "%s", b)
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
			for range 16 {
				resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, h, whole)
				require.Equal(t, 200, resp.StatusCode, "%s", b)
			}
			assert.Equal(t, 0.0, sc.Metric(t, "pd_sidecar_hedges_total", map[string]string{"winner": "local"}))
			setFault(t, prefill, `{"latency_ms":60000,"only":"prefill","times":1}`)
			took := within(t, 30*time.Second, func() { // not the slow prefill's 60 s
				resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, h, whole)
				require.Equal(t, 200, resp.StatusCode, "%s", b)
			})
			t.Logf("the slow prefill's request answered in %v", took)
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_hedges_total", map[string]string{"winner": "local"}))
			assert.Equal(t, 17.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
			harness.Eventually(t, 30*time.Second, "the slow prefill cancelled", func() bool {
				return prefill.Metric(t, "sim_requests_cancelled_total", map[string]string{"kind": "prefill"}) == 1
			})
		})
	}
}
