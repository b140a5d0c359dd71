package e2e

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// What a prefiller's answer may hand on. With SSRF protection on (a static
// allowlist), an allowlisted but hostile prefiller answers kv_transfer_params
// that point the decode engine at a trap on another host (127.0.0.2 stands
// for another pod), smuggle other connectors' fields, or nest a value
// 100,000 deep; a Mooncake bootstrap server answers an engine id no JSON
// string may hold; a sidecar-pull prefiller names a kvtransfer agent off the
// allowlist. Each is an invalid prefill answer: the client gets the local
// prefill's answer (the tokens of a request without the header), the
// fallback is counted with its reason, the decode engine gets none of it and
// the trap no connection. On the lane (default) and on fasthttp's path
// (--stream-loops=0).

// hostTrap is a TCP listener on host that counts the connections it
// accepts (Conns); hold keeps them open, silent, until the test ends (an
// address that never answers), else each is closed at once.
type hostTrap struct {
	*harness.RawServer
	host string
}

func newHostTrap(t *testing.T, host string, hold bool) *hostTrap {
	t.Helper()
	return &hostTrap{host: host, RawServer: harness.StartRawServerOn(t, host, func(c net.Conn) {
		if !hold {
			c.Close()
		}
	})}
}

// serveModes are the two serving paths: the lane (default) and fasthttp's
// goroutines alone.
var serveModes = []struct {
	name  string
	flags []string
	lane  bool
}{{"lane", nil, true}, {"fasthttp", []string{"--stream-loops=0"}, false}}

// ssrfFlags turn SSRF protection on with a static allowlist of addrs.
func ssrfFlags(addrs ...string) []string {
	return []string{"--enable-ssrf-protection", "--prefiller-allowlist", strings.Join(addrs, ",")}
}

// prefillAnswer is a length-capped completion answer carrying params.
func prefillAnswer(params string) string {
	return jsonAnswer(200, `{"id":"cmpl-p","object":"text_completion","model":"sim-model","choices":[{"index":0,"text":" x","finish_reason":"length"}],`+
		`"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10},"kv_transfer_params":`+params+`}`)
}

// nixlParams are NIXL params naming host:port, plus extra members.
func nixlParams(host string, port int, extra string) string {
	return `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2,3]],"remote_engine_id":"evil","remote_request_id":"r-1",` +
		`"remote_host":"` + host + `","remote_port":` + itoa(port) + `,"tp_size":1` + extra + `}`
}

// decodeCounts are the decode engine's proof counters: a decode from
// remote KV, and params it found invalid.
func decodeCounts(t *testing.T, e *harness.Engine) [2]float64 {
	t.Helper()
	return [2]float64{e.Metric(t, "sim_remote_kv_decodes_total", nil), e.Metric(t, "sim_invalid_kv_params_total", nil)}
}

// noParamsSince requires that no request the engine got after its first
// n carried kv_transfer_params or named the trap.
func noParamsSince(t *testing.T, e *harness.Engine, n int, tr *hostTrap) {
	t.Helper()
	reqs := simRequests(t, e)
	require.Greater(t, len(reqs), n, "the engine served the request")
	for _, r := range reqs[n:] {
		b := string(r.Body)
		assert.False(t, gjson.Get(b, "kv_transfer_params").Exists(), "params reached the decode engine: %.300s", b)
		assert.NotContains(t, b, itoa(tr.Port()), "the trap's address reached the decode engine")
	}
}

func TestHostilePrefillerKVParams(t *testing.T) {
	trap := newHostTrap(t, "127.0.0.2", false)
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	cases := []struct{ name, params string }{
		{"remote_host names another host", nixlParams(trap.host, trap.Port(), "")},
		{"a second remote_host, its name escaped", nixlParams("127.0.0.1", trap.Port(), `,"remote\u005fhost":"`+trap.host+`"`)},
		{"other connectors' fields", nixlParams("127.0.0.1", trap.Port(),
			`,"transfer_id":"xfer-1","remote_bootstrap_addr":"http://`+trap.Addr()+`","kv_source":{"agent":"`+trap.Addr()+`","transport":"tcp"}`)},
		{"a value nested 100,000 deep", nixlParams("127.0.0.1", trap.Port(), `,"x":`+deep)},
	}
	body := completionBody(`,"max_tokens":6`)
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			h := startHostile(t, hostileScript{bad: prefillAnswer(nixlParams("127.0.0.1", 1, ""))})
			prefill := harness.StartEngineSim(t, "prefill")
			decode := harness.StartEngineSim(t, "decode")
			flags := append(ssrfFlags(h.Addr(), prefill.HostPort()), hostileFlags...)
			sc := harness.StartSidecar(t, decode.Port, append(flags, mode.flags...)...)
			invalid := map[string]string{"reason": "invalid_kv_params"}

			// The reference: the same request without the header, served locally.
			resp, ref := exchangeRaw(t, sc.Port, "/v1/completions", body, nil, true)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", ref)
			require.NotEmpty(t, textOf(ref))

			t.Run("a legit split still disaggregates", func(t *testing.T) {
				before := decodeCounts(t, decode)
				resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, map[string]string{"x-prefiller-host-port": prefill.HostPort()}, true)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
				assert.Equal(t, textOf(ref), textOf(b), "token-exact")
				assert.Equal(t, before[0]+1, decodeCounts(t, decode)[0], "the decode engine decoded from the prefiller's KV")
				assert.Zero(t, sc.Metric(t, "pd_sidecar_fallbacks_total", nil), "no fallback")
			})

			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					h.mu.Lock()
					h.script = hostileScript{bad: prefillAnswer(tc.params)}
					h.mu.Unlock()
					fallbacks := sc.Metric(t, "pd_sidecar_fallbacks_total", invalid)
					lane := sc.Metric(t, laneRequests, nil)
					counts := decodeCounts(t, decode)
					seen := len(simRequests(t, decode))
					resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body,
						map[string]string{"x-prefiller-host-port": h.Addr(), "X-Request-Id": "hostile-kv-" + mode.name}, true)
					require.Equal(t, http.StatusOK, resp.StatusCode, "the local prefill's answer: %s", b)
					assert.Equal(t, textOf(ref), textOf(b), "the local prefill's tokens")
					assert.Equal(t, fallbacks+1, sc.Metric(t, "pd_sidecar_fallbacks_total", invalid), "an invalid_kv_params fallback")
					assert.Equal(t, counts, decodeCounts(t, decode), "the decode engine saw no remote KV and no invalid params")
					noParamsSince(t, decode, seen, trap)
					if mode.lane {
						assert.Greater(t, sc.Metric(t, laneRequests, nil), lane, "served on the lane")
					} else {
						assert.Zero(t, sc.Metric(t, laneRequests, nil))
					}
					assert.Zero(t, trap.Conns(), "nothing connected to the trap")
				})
			}
			assert.Contains(t, sc.Output(), `"request_id":"hostile-kv-`+mode.name+`"`, "the fallback logged with the request id")
			assert.Contains(t, sc.Output(), "invalid_kv_params")
			alive(t, sc)
		})
	}
}

// TestHostilePrefillerReleaseLeg: a client that leaves after a hostile
// prefill answer arrived, while its local prefill is held back, gets no
// release leg: the handoff was refused, so nothing names the trap.
func TestHostilePrefillerReleaseLeg(t *testing.T) {
	trap := newHostTrap(t, "127.0.0.2", false)
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			h := startHostile(t, hostileScript{bad: prefillAnswer(nixlParams(trap.host, trap.Port(), ""))})
			decode := harness.StartEngineSim(t, "decode")
			flags := append(ssrfFlags(h.Addr()), hostileFlags...)
			sc := harness.StartSidecar(t, decode.Port, append(append(flags, "--decode-first-byte-timeout", "10s"), mode.flags...)...)
			setFault(t, decode, `{"after_head_ms":2000}`) // every streamed answer, the local prefill's too
			body := chatBody(`,"max_tokens":6,"stream":true`)
			conn := postRaw(t, sc.Port, "/v1/chat/completions", body, map[string]string{"x-prefiller-host-port": h.Addr()}, true)
			sent := time.Now()
			harness.Eventually(t, 30*time.Second, "the prefill answered and the decode engine got a leg", func() bool {
				return h.reqs.Load() == 1 && len(simRequests(t, decode)) == 1
			})
			require.NoError(t, conn.SetReadDeadline(sent.Add(300*time.Millisecond)))
			_, err := conn.Read(make([]byte, 1))
			require.ErrorIs(t, err, os.ErrDeadlineExceeded, "the client got nothing before it left")
			require.NoError(t, conn.Close())
			harness.Eventually(t, 30*time.Second, "the request ended", func() bool {
				return sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"code": "499"}) == 1
			})
			time.Sleep(300 * time.Millisecond) // a release leg is sent at once
			assert.Zero(t, sc.Metric(t, kvReleases, nil), "no release leg")
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "invalid_kv_params"}))
			assert.Len(t, simRequests(t, decode), 1, "the local prefill only")
			noParamsSince(t, decode, 0, trap)
			assert.Zero(t, trap.Conns(), "nothing connected to the trap")
		})
	}
}

// TestHostileBootstrapEngineID: a Mooncake bootstrap server whose engine id
// is no id (a NUL in it; a quote and a member after it) is a bad bootstrap
// answer: a local prefill, not a decode leg the engine refuses.
func TestHostileBootstrapEngineID(t *testing.T) {
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			h := startHostile(t, hostileScript{})
			prefill := harness.StartEngineSim(t, "prefill")
			decode := harness.StartEngineSim(t, "decode")
			flags := append(ssrfFlags(prefill.HostPort()), hostileFlags...)
			flags = append(flags, "--kv-connector", "mooncake", "--mooncake-bootstrap-port", itoa(h.Port()))
			sc := harness.StartSidecar(t, decode.Port, append(flags, mode.flags...)...)
			body := completionBody(`,"max_tokens":6`)
			resp, ref := exchangeRaw(t, sc.Port, "/v1/completions", body, nil, true)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", ref)
			for i, id := range []string{`e\u0000x`, `e\",\"remote_host\":\"127.0.0.2`, strings.Repeat("e", 300)} {
				h.mu.Lock()
				h.script = hostileScript{bad: jsonAnswer(200, `{"0":{"engine_id":"`+id+`"}}`)}
				h.mu.Unlock()
				resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, map[string]string{"x-prefiller-host-port": prefill.HostPort()}, true)
				require.Equal(t, http.StatusOK, resp.StatusCode, "engine id %d: the local prefill's answer: %s", i, b)
				assert.Equal(t, textOf(ref), textOf(b), "engine id %d", i)
				assert.Equal(t, float64(i+1), sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "bootstrap_failed"}))
				for _, r := range simRequests(t, decode) {
					assert.False(t, gjson.GetBytes(r.Body, "kv_transfer_params").Exists(), "a decode leg reached the engine: %s", r.Body)
				}
			}
			assert.Zero(t, decode.Metric(t, "sim_invalid_kv_params_total", nil))
		})
	}
}

// TestHostileKVSourceAgent: with --kv-connector sidecar, a prefiller naming a
// kvtransfer agent off the allowlist falls back at once: the sidecar
// neither dials the agent (a trap that accepts and never answers) nor
// borrows blocks, and does not wait out --kv-pull-timeout.
func TestHostileKVSourceAgent(t *testing.T) {
	const pullTimeout = 30 * time.Second
	trap := newHostTrap(t, "127.0.0.2", true)
	e := startKVEngines(t, "tcp")
	// A real descriptor of the prefill engine's, its agent moved to the trap.
	st, pre, _ := scPost(t, e.prefill.URL()+"/v1/completions", tokenPrompt(40, 1, `,"kv_transfer_params":{"do_remote_decode":true,"pull_mode":"sidecar"}`), nil)
	require.Equal(t, http.StatusOK, st, "%s", pre)
	var params map[string]any
	require.NoError(t, json.Unmarshal([]byte(gjson.GetBytes(pre, "kv_transfer_params").Raw), &params))
	params["kv_source"].(map[string]any)["agent"] = trap.Addr()
	hostileParams, err := json.Marshal(params)
	require.NoError(t, err)

	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			h := startHostile(t, hostileScript{bad: prefillAnswer(string(hostileParams))})
			flags := append(ssrfFlags(h.Addr(), e.prefill.HostPort()), hostileFlags...)
			flags = append(flags, "--kv-pull-timeout", pullTimeout.String())
			sc := e.sidecar(t, append(flags, mode.flags...)...)
			body := tokenPrompt(40, 6, "")
			want := e.local(t, "/v1/completions", body)
			seen := len(simRequests(t, e.decode))
			var b []byte
			took := within(t, pullTimeout/3, func() {
				var st int
				st, b, _ = scPost(t, sc.URL()+"/v1/completions", body, map[string]string{"x-prefiller-host-port": h.Addr()})
				require.Equal(t, http.StatusOK, st, "%s", b)
			})
			t.Logf("%s: answered in %v (--kv-pull-timeout %v)", mode.name, took.Round(time.Millisecond), pullTimeout)
			assert.Equal(t, textOf(want), textOf(b), "the local prefill's tokens")
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "invalid_kv_params"}))
			assert.Zero(t, sc.Metric(t, "pd_sidecar_kv_pull_failures_total", nil), "no pull was tried")
			assert.Zero(t, trap.Conns(), "the sidecar never dialed the agent")
			for _, r := range simRequests(t, e.decode)[seen:] {
				assert.NotEqual(t, "/kv/alloc", r.Path, "no blocks borrowed")
				assert.NotContains(t, string(r.Body), itoa(trap.Port()))
			}

			// The engine-sim prefiller's own descriptor names its own host: split.
			st, got, _ := scPost(t, sc.URL()+"/v1/completions", body, e.header())
			require.Equal(t, http.StatusOK, st, "%s", got)
			assert.Equal(t, textOf(want), textOf(got))
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_fallbacks_total", nil), "the legit split did not fall back")
		})
	}
}

// TestHostileMoriIOAnswer: in MoRI-IO write mode, a prefill answer naming
// another host among remote_hosts (the multi-node prefill hosts the decode
// engine connects to) is refused before the decode leg: a local prefill.
func TestHostileMoriIOAnswer(t *testing.T) {
	trap := newHostTrap(t, "127.0.0.2", false)
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			notify := harness.FreePort(t)
			h := startHostile(t, hostileScript{bad: prefillAnswer(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e",` +
				`"remote_block_ids":[],"remote_host":"127.0.0.1","remote_port":0,"tp_size":1,"remote_hosts":["127.0.0.1","` + trap.host + `"],` +
				`"remote_handshake_port":` + itoa(trap.Port()) + `}`)})
			decode := harness.StartEngineSim(t, "decode", "--moriio-notify-port", itoa(notify), "--bootstrap-timeout", "1s")
			flags := append(append(moriFlags(notify), ssrfFlags(h.Addr())...), hostileFlags...)
			sc := harness.StartSidecar(t, decode.Port, append(flags, mode.flags...)...)
			body := completionBody(`,"max_tokens":6`)
			_, ref := exchangeRaw(t, decode.Port, "/v1/completions", body, nil, true)
			seen := len(simRequests(t, decode))
			resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, map[string]string{"x-prefiller-host-port": h.Addr()}, true)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			assert.Equal(t, textOf(ref), textOf(b), "the local prefill's tokens")
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "invalid_kv_params"}))
			noParamsSince(t, decode, seen, trap)
			assert.Zero(t, decode.Metric(t, "sim_moriio_wait_timeouts_total", nil), "no decode leg waited for KV")
			assert.Zero(t, trap.Conns())
		})
	}
}

// hostileEncoderAnswer is an ec-nixl encoder answer naming host:port.
func hostileEncoderAnswer(host string, port int) string {
	return jsonAnswer(200, `{"id":"e","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],`+
		`"ec_transfer_params":{"0123456789abcdef":{"metadata":{},"peer_host":"`+host+`","peer_port":`+strconv.Itoa(port)+`,"size_bytes":23,"shape":[1,23]}}}`)
}

// TestHostileEncoderECParams: an allowlisted ec-nixl encoder naming another
// host for the engines to fetch an item from fails its leg as a bad answer;
// under --on-encoder-failure local the engine encodes the item itself and
// nothing connects to the trap.
func TestHostileEncoderECParams(t *testing.T) {
	trap := newHostTrap(t, "127.0.0.2", false)
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			h := startHostile(t, hostileScript{bad: hostileEncoderAnswer(trap.host, trap.Port())})
			decode := harness.StartEngineSim(t, "decode")
			flags := append(ssrfFlags(h.Addr()), "--ec-connector", "ec-nixl", "--on-encoder-failure", "local")
			sc := harness.StartSidecar(t, decode.Port, append(flags, mode.flags...)...)
			body := `{"model":"sim-model","max_tokens":6,"messages":[{"role":"user","content":[{"type":"text","text":"what is this"},` +
				`{"type":"image_url","image_url":{"url":"https://example.com/cat.png"}}]}]}`
			_, ref := exchangeRaw(t, decode.Port, "/v1/chat/completions", body, nil, true)
			resp, b := exchangeRaw(t, sc.Port, "/v1/chat/completions", body, map[string]string{"x-encoder-hosts-ports": h.Addr()}, true)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			assert.Equal(t, textOf(ref), textOf(b), "the engine encoded the item itself")
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_encoder_failures_total", map[string]string{"reason": "bad_answer"}))
			reqs := simRequests(t, decode)
			require.NotEmpty(t, reqs)
			assert.False(t, gjson.GetBytes(reqs[len(reqs)-1].Body, "ec_transfer_params").Exists(), "no encoder params reached the engine")
			assert.Zero(t, trap.Conns(), "nothing connected to the trap")
		})
	}
}
