package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// One parse, over real processes and a conversation's real history: the
// sidecar reads a body's members as gjson does (the first of a repeated
// name), its engines as Python's json and Go's encoding/json do (the last;
// Go's also matching names case-insensitively). A turn whose body the two
// would read differently — its history's digest taken over one reading,
// the prompt the engine renders from the other — would pull the KV of one
// text under a prompt of another. Each such body is refused 400 before
// any leg (counted as ambiguous_json, logged with its request id), on the
// lane and on fasthttp's path; the conversation's history stays its own,
// and its owner's next turn uses it and is token-exact against a local
// run of the same body. An escaped name alone is no ambiguity: served,
// with the history, token-exact. So is a stream flag that is not a JSON
// boolean: vLLM takes "yes" for true where the sidecar would read false.

// jsonStr is s as a JSON string.
func jsonStr(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// chatMsg is one message, written by hand, members in order: role, then
// each name and text of more (name, value pairs written as given).
func chatMsg(role, content string, more ...string) string {
	m := `{"role":` + jsonStr(role) + `,"content":` + jsonStr(content)
	for i := 0; i+1 < len(more); i += 2 {
		m += `,"` + more[i] + `":` + more[i+1]
	}
	return m + "}"
}

func TestOneParseAmbiguousBodies(t *testing.T) {
	m1, m2, evil := userText(901, 120), userText(902, 30), userText(903, 120)
	t.Setenv("POD_IP", "127.0.0.1") // the pod's address, where its decode engine's side channel listens
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			prefill := harness.StartEngineSim(t, "prefill", "--bidirectional-kv-xfer", "--no-enable-prefix-caching")
			decode := harness.StartEngineSim(t, "decode", "--bidirectional-kv-xfer")
			ref := harness.StartEngineSim(t, "both")
			sc := harness.StartSidecar(t, decode.Port, append([]string{"--enable-bidirectional-kv-xfer", "--decode-side-channel-port", itoa(decode.KVPort)}, mode.flags...)...)
			trap := newTrap(t)
			split := func(session string) map[string]string {
				return map[string]string{"x-prefiller-host-port": prefill.HostPort(), "x-session-token": session}
			}
			send := func(body string, headers map[string]string) (int, []byte) {
				resp, b := exchangeRaw(t, sc.Port, "/v1/chat/completions", body, headers, mode.lane)
				harness.Eventually(t, 30*time.Second, "the request ended", func() bool {
					return sc.Metric(t, "pd_sidecar_inflight_requests", nil) == 0
				})
				return resp.StatusCode, b
			}
			chat := func(msgs ...string) string {
				return `{"model":"sim-model","max_tokens":24,"messages":[` + strings.Join(msgs, ",") + `]}`
			}

			// The victim's first turn: its history is kept.
			code, b := send(chat(chatMsg("user", m1)), split("victim"))
			require.Equal(t, http.StatusOK, code, "%s", b)
			a := readChat(t, b, false)
			answer := chatMsg("assistant", a.content)
			require.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_multiturn_entries_total", map[string]string{"outcome": "kept"}))

			// Bodies the sidecar would read as the victim's next turn (its
			// history's digest matches) while the engine reads another text.
			next := chatMsg("user", m2)
			ambiguous := []struct{ name, body string }{
				{"content twice", chat(chatMsg("user", m1, "content", jsonStr(evil)), answer, next)},
				{"role twice", chat(chatMsg("user", m1, "role", `"system"`), answer, next)},
				{"content twice, the second escaped", chat(chatMsg("user", m1, `\u0063ontent`, jsonStr(evil)), answer, next)},
				{"Content beside content", chat(chatMsg("user", m1, "Content", jsonStr(evil)), answer, next)},
				{"CONTENT beside content in the answer", chat(chatMsg("user", m1), chatMsg("assistant", a.content, "CONTENT", jsonStr(evil)), next)},
				{"messages twice", strings.TrimSuffix(chat(chatMsg("user", m1), answer, next), "}") + `,"messages":[` + chatMsg("user", evil) + `,` + answer + `,` + next + `]}`},
				{"Messages beside messages", strings.TrimSuffix(chat(chatMsg("user", m1), answer, next), "}") + `,"Messages":[` + chatMsg("user", evil) + `]}`},
				{"max_tokens twice", strings.TrimSuffix(chat(chatMsg("user", m1), answer, next), "}") + `,"max_tokens":1}`},
				{"stream twice", strings.TrimSuffix(chat(chatMsg("user", m1), answer, next), "}") + `,"stream":false,"stream":true}`},
				{"stream as a word vLLM takes for true", strings.TrimSuffix(chat(chatMsg("user", m1), answer, next), "}") + `,"stream":"yes"}`},
				{"kv_transfer_params twice", strings.TrimSuffix(chat(chatMsg("user", m1), answer, next), "}") + `,"kv_transfer_params":null,"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"127.0.0.1","remote_port":` + itoa(trap.Port()) + `}}`},
				{"a lone surrogate", strings.Replace(chat(chatMsg("user", m1), answer, next), `"content":"w`, `"content":"\ud800w`, 1)},
			}
			before := struct{ prefill, decode int }{len(simRequests(t, prefill)), len(simRequests(t, decode))}
			for i, tc := range ambiguous {
				rid := fmt.Sprintf("one-parse-%s-%d", mode.name, i)
				hdr := split("victim")
				hdr["x-request-id"] = rid
				code, b := send(tc.body, hdr)
				require.Equal(t, http.StatusBadRequest, code, "%s: %s", tc.name, b)
				assert.Equal(t, int64(400), gjson.GetBytes(b, "error.code").Int(), tc.name)
				assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "read differently", tc.name)
				assert.Contains(t, sc.Output(), rid, "%s: logged with its request id", tc.name)
			}
			assert.Equal(t, float64(len(ambiguous)), sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": "ambiguous_json"}))
			assert.Len(t, simRequests(t, prefill), before.prefill, "no ambiguous body reached the prefiller")
			assert.Len(t, simRequests(t, decode), before.decode, "nor the decode engine")
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_multiturn_entries_total", map[string]string{"outcome": "kept"}), "no entry planted")
			assert.Zero(t, trap.Conns(), "nothing connected to the address a repeated kv_transfer_params named")

			// A completion's prompt named twice, or in another case.
			for _, body := range []string{
				`{"model":"sim-model","prompt":` + jsonStr(m1) + `,"max_tokens":4,"prompt":` + jsonStr(evil) + `}`,
				`{"model":"sim-model","prompt":` + jsonStr(m1) + `,"max_tokens":4,"Prompt":` + jsonStr(evil) + `}`,
			} {
				resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, split("victim"), mode.lane)
				require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
			}
			assert.Equal(t, float64(len(ambiguous)+2), sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": "ambiguous_json"}))

			// The victim's honest next turn, with one member name escaped
			// (every decoder reads it as content): its own history, pulled,
			// and the answer a local run of the same body gives.
			body := chat(chatMsg("user", m1), answer, `{"role":"user","\u0063ontent":`+jsonStr(m2)+`}`)
			uses := sc.Metric(t, "pd_sidecar_multiturn_uses_total", nil)
			code, b = send(body, split("victim"))
			require.Equal(t, http.StatusOK, code, "%s", b)
			got := readChat(t, b, false)
			assert.Equal(t, uses+1, sc.Metric(t, "pd_sidecar_multiturn_uses_total", nil), "the turn used its history")
			code, b, _ = scPost(t, ref.URL()+"/v1/chat/completions", body, nil)
			require.Equal(t, http.StatusOK, code, "%s", b)
			assert.Equal(t, readChat(t, b, false).content, got.content, "token-exact against a local run")
		})
	}
}
