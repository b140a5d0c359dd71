package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// What a decode engine's answer may leave for a conversation's next turn
// (--enable-bidirectional-kv-xfer). The local engine is a fake that answers
// every decode leg with kv_transfer_params of its choosing: naming another
// pod's address (127.0.0.2, where a trap listens), this pod's address at a
// port other than the engine's NIXL side channel (ssh's, redis's in an
// IPv4-mapped form, a trap's: the prefill engine would dial that port of
// its own pod's loopback), a member vLLM does not document, a prefill's
// params instead of a decode's, a value nested 100,000 deep; in a JSON
// answer or in a stream's last event. None is kept: counted refused, the
// client gets null where they were, and the next turn, which extends the
// first exactly, carries no history to the (real) prefiller, which is
// never told of a trap. The sidecar knows its pod's IP (POD_IP, as the
// chart sets it): 127.0.0.1, and the engine's side channel: 5600. A
// sidecar whose pod address is not loopback (POD_IP 192.0.2.1) refuses
// loopback addresses and names at the side channel's port, and one that
// knows no pod address keeps nothing, not even this pod's loopback side
// channel. On the lane and on fasthttp's path.
func TestMultiturnHostileDecodeParams(t *testing.T) {
	trap := newHostTrap(t, "127.0.0.2", false)
	podTrap := newHostTrap(t, "127.0.0.1", false) // a port of this pod that is not the side channel
	good := func(host string, port int, extra string) string {
		return `{"do_remote_prefill":false,"do_remote_decode":true,"remote_block_ids":[[1,2,3,4,5,6,7,8]],"remote_engine_id":"d","remote_request_id":"r-1",` +
			`"remote_host":"` + host + `","remote_port":` + itoa(port) + `,"tp_size":1,"remote_num_tokens":500` + extra + `}`
	}
	type hostileCase struct {
		name, params string
		stream       bool
	}
	cases := []hostileCase{
		{"another pod's side channel", good("127.0.0.2", trap.Port(), ""), false},
		{"another pod's side channel, in the stream's last event", good("127.0.0.2", trap.Port(), ""), true},
		{"this pod's address, ssh's port", good("127.0.0.1", 22, ""), false},
		{"this pod's address in an IPv4-mapped form, redis's port", good("::ffff:127.0.0.1", 6379, ""), false},
		{"this pod's address, a trap's port", good("127.0.0.1", podTrap.Port(), ""), false},
		{"this pod's address in an IPv4-mapped form, a trap's port, in the stream's last event", good("::ffff:127.0.0.1", podTrap.Port(), ""), true},
		{"another loopback address at the side channel's port", good("127.0.0.2", 5600, ""), false},
		{"IPv6 loopback at the side channel's port", good("::1", 5600, ""), false},
		{"a member vLLM does not document", good("127.0.0.1", 5600, `,"remote_bootstrap_addr":"127.0.0.2:8998"`), false},
		{"a prefill's params", strings.Replace(good("127.0.0.1", 5600, ""), `"do_remote_prefill":false,"do_remote_decode":true`, `"do_remote_prefill":true,"do_remote_decode":false`, 1), false},
		{"a value nested 100,000 deep", good("127.0.0.1", 5600, `,"transfer_mode":`+strings.Repeat("[", 100000)+strings.Repeat("]", 100000)), true},
	}
	loopback := []hostileCase{
		{"127.0.0.1", good("127.0.0.1", 5600, ""), false},
		{"127.0.0.2", good("127.0.0.2", 5600, ""), false},
		{"an IPv4-mapped 127.0.0.1", good("::ffff:127.0.0.1", 5600, ""), false},
		{"::1", good("::1", 5600, ""), false},
		{"localhost", good("localhost", 5600, ""), false},
		{"LOCALHOST", good("LOCALHOST", 5600, ""), true},
	}
	pods := []struct {
		podIP string
		cases []hostileCase
	}{{"127.0.0.1", cases}, {"192.0.2.1", loopback}, {"", loopback}}
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			prefill := harness.StartEngineSim(t, "prefill", "--bidirectional-kv-xfer", "--no-enable-prefix-caching")
			var params atomic.Pointer[string]
			params.Store(new(string)) // the sidecar asks the engine's version at once
			var stream atomic.Bool
			decode := harness.StartRawServer(t, func(c net.Conn) {
				harness.ServeRequests(c, func(c net.Conn, _ *http.Request, body []byte) bool {
					_, err := c.Write([]byte(hostileDecodeAnswer(*params.Load(), stream.Load(), body)))
					return err == nil
				})
			})
			for _, pod := range pods {
				t.Setenv("POD_IP", pod.podIP)
				sc := harness.StartSidecar(t, decode.Port(), append([]string{"--enable-bidirectional-kv-xfer", "--decode-side-channel-port", "5600"}, mode.flags...)...)
				for i, tc := range pod.cases {
					name := "POD_IP " + pod.podIP + ": " + tc.name
					headers := map[string]string{"x-prefiller-host-port": prefill.HostPort(), "x-session-token": fmt.Sprint("s", i)}
					params.Store(&tc.params)
					stream.Store(tc.stream)
					first := []map[string]any{user(uint64(40+i), 120)}
					body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": first, "max_tokens": 8, "stream": tc.stream})
					refused := sc.Metric(t, "pd_sidecar_multiturn_entries_total", map[string]string{"outcome": "refused"})
					resp, b := exchangeRaw(t, sc.Port, "/v1/chat/completions", string(body), headers, mode.lane)
					require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", name, b)
					a := readChat(t, b, tc.stream) // checks the client saw no params
					assert.Equal(t, " hostile answer", a.content, name)
					assert.Equal(t, refused+1, sc.Metric(t, "pd_sidecar_multiturn_entries_total", map[string]string{"outcome": "refused"}), "%s: refused", name)

					next := append(first, a.message(false), user(uint64(60+i), 40))
					body, _ = json.Marshal(map[string]any{"model": "sim-model", "messages": next, "max_tokens": 8})
					noEntry := sc.Metric(t, "pd_sidecar_multiturn_misses_total", map[string]string{"reason": "no_entry"})
					resp, b = exchangeRaw(t, sc.Port, "/v1/chat/completions", string(body), headers, mode.lane)
					require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", name, b)
					assert.Equal(t, noEntry+1, sc.Metric(t, "pd_sidecar_multiturn_misses_total", map[string]string{"reason": "no_entry"}), "%s: nothing kept", name)
					reqs := simRequests(t, prefill)
					require.NotEmpty(t, reqs)
					assert.False(t, gjson.GetBytes(reqs[len(reqs)-1].Body, "kv_transfer_params.remote_block_ids").IsArray(), "%s: no history in the prefill leg", name)
				}
				harness.Eventually(t, 10*time.Second, "the requests ended", func() bool {
					return sc.Metric(t, "pd_sidecar_inflight_requests", nil) == 0
				})
				assert.Equal(t, 0.0, sc.Metric(t, "pd_sidecar_multiturn_uses_total", nil))
				assert.Equal(t, 0.0, sc.Metric(t, "pd_sidecar_multiturn_entries_total", map[string]string{"outcome": "kept"}), "POD_IP %q: nothing kept", pod.podIP)
			}
			assert.Equal(t, 0.0, prefill.Metric(t, "sim_bidirectional_history_pull_failures_total", nil), "the prefiller was never sent anywhere")
			assert.Equal(t, int64(0), trap.Conns(), "nothing connected to the trap")
			assert.Equal(t, int64(0), podTrap.Conns(), "nothing connected to the trap on this pod's address")
		})
	}
}

// hostileDecodeAnswer is the fake decode engine's answer to a chat request
// body: JSON, or a stream whose last event carries params.
func hostileDecodeAnswer(params string, stream bool, body []byte) string {
	if !gjson.GetBytes(body, "stream").Bool() {
		stream = false
	}
	if !stream {
		return jsonAnswer(200, `{"id":"chatcmpl-h","object":"chat.completion","model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":" hostile answer"},"finish_reason":"length"}],`+
			`"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11},"kv_transfer_params":`+params+`}`)
	}
	events := `data: {"id":"chatcmpl-h","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"chatcmpl-h","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" hostile"},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"chatcmpl-h","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" answer"},"finish_reason":"length"}],"kv_transfer_params":` + params + "}\n\n" +
		"data: [DONE]\n\n"
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(events), events)
}
