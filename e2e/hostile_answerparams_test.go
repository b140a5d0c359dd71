package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// decodeSecret is the engine id in the fake decode engine's params: no
// client may read it.
const decodeSecret = "decode-secret-engine"

// decodeParamsJSON are a decode engine's kv_transfer_params as vLLM's
// bidirectional_kv_xfer writes them: this pod's side channel and blocks.
const decodeParamsJSON = `{"do_remote_prefill":false,"do_remote_decode":true,"remote_block_ids":[[1,2,3,4,5,6,7,8]],"remote_engine_id":"` + decodeSecret +
	`","remote_request_id":"r-1","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1,"remote_num_tokens":500}`

// paramsSpellings are the ways a hostile engine writes the member, as body
// members (",..."): a client's JSON parser reads each as the params.
var paramsSpellings = []struct{ name, members string }{
	{"plain", `,"kv_transfer_params":` + decodeParamsJSON},
	{"null, then the params (a parser takes the last)", `,"kv_transfer_params":null,"x":1,"kv_transfer_params":` + decodeParamsJSON},
	{"an escaped name", `,"kv\u005ftransfer_params":` + decodeParamsJSON},
	{"cut across two data lines (one event to a client)", `,"kv_transfer_params":` + "\n" + decodeParamsJSON},
}

// paramsAnswer is the fake decode engine's answer to a request of path and
// body: its API's JSON answer or stream, whose last piece carries members.
func paramsAnswer(path string, body []byte, members string) string {
	stream := gjson.GetBytes(body, "stream").Bool()
	switch path {
	case "/v1/chat/completions":
		if !stream {
			return jsonAnswer(200, `{"id":"chatcmpl-f","object":"chat.completion","model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":" fake answer"},"finish_reason":"length"}],`+
				`"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}`+members+`}`)
		}
		return sseAnswer(`{"id":"chatcmpl-f","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
			`{"id":"chatcmpl-f","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" fake"},"finish_reason":null}]}`,
			`{"id":"chatcmpl-f","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" answer"},"finish_reason":"length"}]`+members+`}`,
			"[DONE]")
	case "/v1/responses":
		if !stream {
			return jsonAnswer(200, `{"id":"resp-f","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},`+
				`"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":" fake answer"}]}]`+members+`}`)
		}
		return sseAnswer(`{"type":"response.created","response":{"id":"resp-f","status":"in_progress"}}`,
			`{"type":"response.output_text.delta","delta":" fake answer"}`,
			`{"type":"response.completed","response":{"id":"resp-f","status":"incomplete"`+members+`}}`)
	}
	return completionAnswer(stream, "", members)
}

// sseAnswer is a 200 event stream of the events' data, a data line for
// each line of one.
func sseAnswer(data ...string) string { return sseAnswerHead("", data...) }

// sseAnswerHead is sseAnswer with extra lines in its head.
func sseAnswerHead(head string, data ...string) string {
	var b strings.Builder
	for _, d := range data {
		for line := range strings.SplitSeq(d, "\n") {
			b.WriteString("data: " + line + "\n")
		}
		b.WriteString("\n")
	}
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n%sContent-Length: %d\r\n\r\n%s", head, b.Len(), b.String())
}

// clientParams reads an answer as a client does (encoding/json: the last
// of a repeated member, names unescaped; SSE data lines joined) and
// returns what it finds of every kv_transfer_params: "null" or "set".
func clientParams(t *testing.T, what string, b []byte, stream bool) []string {
	t.Helper()
	pieces := [][]byte{b}
	if stream {
		pieces = nil
		for ev := range strings.SplitSeq(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n\n") {
			var data []string
			for line := range strings.SplitSeq(ev, "\n") {
				if d, ok := strings.CutPrefix(line, "data:"); ok {
					data = append(data, strings.TrimPrefix(d, " "))
				}
			}
			if len(data) > 0 && data[0] != "[DONE]" {
				pieces = append(pieces, []byte(strings.Join(data, "\n")))
			}
		}
		require.NotEmpty(t, pieces, "%s: events: %s", what, b)
	}
	var found []string
	for _, p := range pieces {
		var v any
		require.NoError(t, json.Unmarshal(p, &v), "%s: a client reads every piece: %s", what, p)
		found = append(found, paramsFound(v)...)
	}
	return found
}

// paramsFound lists, for every kv_transfer_params member in v, "null" or
// "set".
func paramsFound(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			switch {
			case k == "kv_transfer_params" && e == nil:
				out = append(out, "null")
			case k == "kv_transfer_params":
				out = append(out, "set")
			default:
				out = append(out, paramsFound(e)...)
			}
		}
	case []any:
		for _, e := range v {
			out = append(out, paramsFound(e)...)
		}
	}
	return out
}

// TestHostileDecodeParamsNeverReachClient: the decode engine's
// kv_transfer_params (this pod's side channel, engine id, block ids) reach
// no client unless --trust-client-kv-params, whatever multi-turn reuse
// decided: with it on and following the request (a chat with a session
// key), and where it does not follow — no session key, a key of 257 bytes
// or with a space, a token-id prompt, n > 1, /v1/responses — and with it
// off. The local engine is a fake that writes the params plainly, twice
// (null first: a client's parser takes the last), under an escaped name
// and cut across two data lines of one event, in JSON answers and in a
// stream's last event; the client reads
// every answer as a client does and finds them null, nor any byte of
// them. Split answers (a fake prefiller's handoff, proven by the decode
// leg) and local ones: no prefiller named, a split declined (short
// prompt), a refused prefiller's fallback, a dead prefiller's. On the
// lane (its requests counted) and on fasthttp's path. With
// --trust-client-kv-params the client gets them as written.
func TestHostileDecodeParamsNeverReachClient(t *testing.T) {
	t.Setenv("POD_IP", "127.0.0.1")
	long := strings.Repeat("word ", 60)                       // ~100 tokens: split
	ids := strings.TrimSuffix(strings.Repeat("11,", 60), ",") // 60 token ids: split
	chat := func(content, extra string) (string, string) {
		return "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"` + content + `"}],"max_tokens":4` + extra + `}`
	}
	type request struct {
		name, path, body, key string
	}
	requests := func(text string, idList string) []request {
		var out []request
		add := func(name, key string, pb func() (string, string)) {
			p, b := pb()
			out = append(out, request{name, p, b, key})
		}
		add("chat, the feature follows", "conv-1", func() (string, string) { return chat(text, "") })
		add("chat, no session key", "", func() (string, string) { return chat(text, "") })
		add("chat, a key of 257 bytes", strings.Repeat("k", 257), func() (string, string) { return chat(text, "") })
		add("chat, a key with a space", "a key", func() (string, string) { return chat(text, "") })
		add("chat, n 2", "conv-2", func() (string, string) { return chat(text, `,"n":2`) })
		add("completions, token ids", "conv-3", func() (string, string) {
			return "/v1/completions", `{"model":"sim-model","prompt":[` + idList + `],"max_tokens":4}`
		})
		add("completions, best_of 2", "conv-4", func() (string, string) {
			return "/v1/completions", `{"model":"sim-model","prompt":"` + text + `","max_tokens":4,"best_of":2}`
		})
		add("responses", "conv-5", func() (string, string) {
			return "/v1/responses", `{"model":"sim-model","input":"` + text + `","max_output_tokens":4}`
		})
		return out
	}
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			var spelling atomic.Pointer[string] // the members the fake engine writes now
			spelling.Store(new(string))
			local := startLegEngine(t, func(req *http.Request, body []byte) string {
				return paramsAnswer(req.URL.Path, body, *spelling.Load())
			})
			prefiller := startLegEngine(t, func(*http.Request, []byte) string {
				return prefillAnswer(nixlParams("127.0.0.1", 5600, ""))
			})
			dead := harness.FreePort(t)
			routes := []struct {
				name, prefiller string
				short           bool
				split           bool
			}{
				{"split", prefiller.Addr(), false, true},
				{"local", "", false, false},
				{"declined (short prompt)", prefiller.Addr(), true, false},
				{"fallback (a refused prefiller)", "no-port", false, false},
				{"fallback (a dead prefiller)", harness.HostPort(dead), false, false},
			}
			for _, sidecar := range []struct {
				name  string
				flags []string
				trust bool
			}{
				{"multi-turn on", []string{"--enable-bidirectional-kv-xfer"}, false},
				{"multi-turn off", nil, false},
				{"--trust-client-kv-params", []string{"--enable-bidirectional-kv-xfer", "--trust-client-kv-params"}, true},
			} {
				flags := append([]string{"--min-remote-prefill-tokens", "50"}, append(sidecar.flags, mode.flags...)...)
				sc := harness.StartSidecar(t, local.Port(), flags...)
				onLoops := sc.Metric(t, "pd_sidecar_loop_requests_total", nil)
				served := 0
				for _, route := range routes {
					text, idList := long, ids
					if route.short {
						text, idList = "hi", "11"
					}
					for _, rq := range requests(text, idList) {
						for _, sp := range paramsSpellings {
							if sidecar.trust && sp.name != paramsSpellings[0].name {
								continue
							}
							for _, stream := range []bool{false, true} {
								what := fmt.Sprintf("%s, %s, %s, %s, stream %v", sidecar.name, route.name, rq.name, sp.name, stream)
								spelling.Store(&sp.members)
								headers := map[string]string{}
								if rq.key != "" {
									headers["x-session-token"] = rq.key
								}
								if route.prefiller != "" {
									headers["x-prefiller-host-port"] = route.prefiller
								}
								body := strings.TrimSuffix(rq.body, "}") + fmt.Sprintf(`,"stream":%v}`, stream)
								resp, b := exchangeRaw(t, sc.Port, rq.path, body, headers, mode.lane)
								require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", what, b)
								served++
								require.Contains(t, string(b), "fake", "%s: the engine's answer: %s", what, b)
								legs := local.take()
								require.Len(t, legs, 1, what)
								pre := prefillLegs(t, what, prefiller.take())
								if route.split {
									require.Len(t, pre, 1, "%s: split", what)
									assert.Equal(t, "evil", gjson.GetBytes(legs[0].body, "kv_transfer_params.remote_engine_id").String(), "%s: the decode leg carries the handoff", what)
								} else {
									require.Empty(t, pre, "%s: served locally", what)
								}
								if sidecar.trust {
									assert.Contains(t, string(b), decodeSecret, "%s: trusted: passed on", what)
									assert.Contains(t, clientParams(t, what, b, stream), "set", what)
									continue
								}
								assert.NotContains(t, string(b), decodeSecret, "%s: a byte of the params reached the client: %s", what, b)
								assert.NotContains(t, clientParams(t, what, b, stream), "set", "%s: %s", what, b)
							}
						}
					}
				}
				if mode.lane {
					assert.Equal(t, onLoops+float64(served), sc.Metric(t, "pd_sidecar_loop_requests_total", nil), "%s: the lane served them", sidecar.name)
				}
				assert.Positive(t, sc.Metric(t, "pd_sidecar_split_declined_total", map[string]string{"reason": "short_prompt"}), sidecar.name)
				assert.Positive(t, sc.Metric(t, "pd_sidecar_fallbacks_total", nil), sidecar.name)
			}
		})
	}
}

// TestHostileDecodeParamsChunkedDecode: a chunked decode's JSON answer
// (--decode-chunk-size) is made of its last chunk's answer, where the
// decode engine writes its params: the client finds them null there too,
// split or local, and its stream, which the sidecar writes, carries none.
// On the lane and on fasthttp's path.
func TestHostileDecodeParamsChunkedDecode(t *testing.T) {
	t.Setenv("POD_IP", "127.0.0.1")
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			var spelling atomic.Pointer[string]
			spelling.Store(new(string))
			local := startLegEngine(t, func(req *http.Request, body []byte) string {
				return paramsAnswer(req.URL.Path, body, *spelling.Load())
			})
			prefiller := startLegEngine(t, func(*http.Request, []byte) string {
				return prefillAnswer(nixlParams("127.0.0.1", 5600, ""))
			})
			sc := harness.StartSidecar(t, local.Port(), append([]string{"--enable-bidirectional-kv-xfer", "--decode-chunk-size", "2"}, mode.flags...)...)
			onLoops := sc.Metric(t, "pd_sidecar_loop_requests_total", nil)
			for _, split := range []bool{false, true} {
				for _, sp := range paramsSpellings {
					for _, stream := range []bool{false, true} {
						what := fmt.Sprintf("split %v, %s, stream %v", split, sp.name, stream)
						spelling.Store(&sp.members)
						headers := map[string]string{"x-session-token": "conv-c"}
						if split {
							headers["x-prefiller-host-port"] = prefiller.Addr()
						}
						body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":%v}`, stream)
						resp, b := exchangeRaw(t, sc.Port, "/v1/chat/completions", body, headers, mode.lane)
						require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", what, b)
						require.Contains(t, string(b), "fake", "%s: %s", what, b)
						legs := local.take()
						require.Len(t, legs, 2, "%s: two chunks", what)
						if split {
							require.Len(t, prefillLegs(t, what, prefiller.take()), 1, what)
							assert.Equal(t, "evil", gjson.GetBytes(legs[0].body, "kv_transfer_params.remote_engine_id").String(), "%s: the first chunk carries the handoff", what)
						}
						assert.NotContains(t, string(b), decodeSecret, "%s: a byte of the params reached the client: %s", what, b)
						assert.NotContains(t, clientParams(t, what, b, stream), "set", "%s: %s", what, b)
					}
				}
			}
			n := float64(2 * len(paramsSpellings) * 2)
			assert.Equal(t, n, sc.Metric(t, "pd_sidecar_chunked_decodes_total", nil), "every decode chunked")
			if mode.lane {
				assert.Equal(t, onLoops+n, sc.Metric(t, "pd_sidecar_loop_requests_total", nil), "the lane served them")
			}
		})
	}
}

// prefillLegs are the prefill legs among legs a prefiller read, less the
// release legs multi-turn reuse sends it for histories no turn will read
// (the fake decode engine answers every request alike, so each answer's
// history replaces the one before, whose pin is released; they come in the
// background, at any time). A release leg carries a history the sidecar
// checked: this pod's side channel, never a byte of the client's.
func prefillLegs(t *testing.T, what string, legs []engineLeg) []engineLeg {
	t.Helper()
	out := legs[:0]
	for _, l := range legs {
		if !strings.HasPrefix(l.header.Get("X-Request-Id"), "history-release-") {
			out = append(out, l)
			continue
		}
		assert.Equal(t, "/v1/completions", l.path, "%s: a release leg", what)
		assert.Equal(t, "release", gjson.GetBytes(l.body, "prompt").String(), "%s: a release leg: %s", what, l.body)
		assert.Equal(t, "127.0.0.1", gjson.GetBytes(l.body, "kv_transfer_params.remote_host").String(), "%s: the pod's own side channel: %s", what, l.body)
		assert.Empty(t, l.header.Get("X-Session-Token"), "%s: no client header", what)
	}
	return out
}
