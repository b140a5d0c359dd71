package e2e

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// These tests prove that a client's own connector fields (the addresses an
// engine would connect to for KV) never reach an engine: a trap listener
// at the address a body names counts the connections it gets, and
// engine-sim's journal shows the body it received. Each case runs on the
// lane (the request whole in one write) and on fasthttp's path (the head
// in two writes).

// trap is a TCP listener that counts the connections it accepts (Conns)
// and closes each at once.
type trap struct {
	*harness.RawServer
	host string
}

func newTrap(t *testing.T) *trap {
	t.Helper()
	return &trap{host: "127.0.0.1", RawServer: harness.StartRawServer(t, func(c net.Conn) { c.Close() })}
}

// bodyFieldCases are the client connector fields, each naming tr.
func bodyFieldCases(tr *trap) []struct{ name, field, extra string } {
	nixl := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"evil","remote_block_ids":[[1,2]],"remote_request_id":"r","remote_host":"` + tr.host + `","remote_port":` + itoa(tr.Port()) + `,"tp_size":1}`
	return []struct{ name, field, extra string }{
		{"kv_transfer_params nixl", "kv_transfer_params", `,"kv_transfer_params":` + nixl},
		{"kv_transfer_params escaped name", "kv_transfer_params", `,"kv_transfer_para\u006ds":` + nixl},
		{"mooncake remote_bootstrap_addr", "kv_transfer_params", `,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"transfer_id":"xfer-1","remote_bootstrap_addr":"http://` + tr.Addr() + `","remote_engine_id":"e"}`},
		{"sidecar kv_source", "kv_transfer_params", `,"kv_transfer_params":{"do_remote_prefill":true,"kv_source":{"agent":"` + tr.Addr() + `","transport":"tcp"},"kv_preloaded":{"alloc_id":"a","block_ids":[1],"num_tokens":1}}`},
		{"ec_transfer_params", "ec_transfer_params", `,"ec_transfer_params":{"remote_host":"` + tr.host + `","remote_port":` + itoa(tr.Port()) + `}`},
		{"sglang bootstrap", "bootstrap_host", `,"bootstrap_host":"` + tr.host + `","bootstrap_port":` + itoa(tr.Port()) + `,"bootstrap_room":42`},
		{"top-level remote_bootstrap_addr", "remote_bootstrap_addr", `,"remote_bootstrap_addr":"http://` + tr.Addr() + `","transfer_id":"xfer-1"`},
	}
}

var clientFieldNames = []string{"kv_transfer_params", "ec_transfer_params", "bootstrap_host", "bootstrap_port",
	"bootstrap_room", "bootstrap_pair_key", "remote_bootstrap_addr", "transfer_id", "kv_source", "kv_preloaded"}

// assertNoClientField fails when the body an engine got names tr or
// carries a client connector field at its top level.
func assertNoClientField(t *testing.T, body string, tr *trap) {
	t.Helper()
	assert.NotContains(t, body, itoa(tr.Port()), "the client's address reached the engine: %s", body)
	gjson.Parse(body).ForEach(func(k, _ gjson.Result) bool {
		assert.NotContains(t, clientFieldNames, k.Str, "client field reached the engine: %s", body)
		return true
	})
}

func lastBody(t *testing.T, e *harness.Engine) string {
	t.Helper()
	reqs := simRequests(t, e)
	require.NotEmpty(t, reqs)
	return string(reqs[len(reqs)-1].Body)
}

func TestKVFieldsLocalNeverReachTheEngine(t *testing.T) {
	tr := newTrap(t)
	decode := harness.StartEngineSim(t, "decode")
	sc := harness.StartSidecar(t, decode.Port, "--enable-ssrf-protection", "--prefiller-allowlist", "127.0.0.1:1")
	want := map[string]float64{}
	for _, whole := range []bool{true, false} {
		for _, c := range bodyFieldCases(tr) {
			t.Run(c.name+map[bool]string{true: " lane", false: " fasthttp"}[whole], func(t *testing.T) {
				resp, b := exchangeRaw(t, sc.Port, "/v1/completions", completionBody(`,"max_tokens":4`+c.extra), map[string]string{"X-Request-Id": "kvf-" + strings.ReplaceAll(c.name, " ", "-")}, whole)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
				assertNoClientField(t, lastBody(t, decode), tr)
				want[c.field]++
			})
		}
	}
	// Passthrough: SGLang's own /generate reads bootstrap_* too.
	for _, whole := range []bool{true, false} {
		_, _ = exchangeRaw(t, sc.Port, "/generate", `{"text":"hi","bootstrap_host":"`+tr.host+`","bootstrap_port":`+itoa(tr.Port())+`}`, nil, whole)
		var got string
		for _, r := range rawJournal(t, decode) {
			if gjson.Get(r, "path").String() == "/generate" {
				got = gjson.Get(r, "body").Raw
			}
		}
		require.NotEmpty(t, got)
		assertNoClientField(t, got, tr)
		want["bootstrap_host"]++
	}
	time.Sleep(100 * time.Millisecond)
	assert.Zero(t, tr.Conns(), "the engine connected to the client's address")
	assert.Zero(t, decode.Metric(t, "sim_remote_kv_decodes_total", nil))
	for f, n := range want {
		assert.Equal(t, n, sc.Metric(t, "pd_sidecar_requests_sanitized_total", map[string]string{"field": f}), f)
	}
	assert.Contains(t, sc.Output(), `"request_id":"kvf-sglang-bootstrap"`, "removal logged with the request id")
}

// rawJournal is engine-sim's whole journal, one JSON entry each.
func rawJournal(t *testing.T, e *harness.Engine) []string {
	t.Helper()
	resp, err := http.Get(e.URL() + "/sim/requests")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out []string
	gjson.ParseBytes(b).ForEach(func(_, v gjson.Result) bool { out = append(out, v.Raw); return true })
	return out
}

func TestKVFieldsSplitLegsCarryOnlyTheConnectors(t *testing.T) {
	tr := newTrap(t)
	for _, spec := range []string{"nixlv2", "sglang", "mooncake"} {
		t.Run(spec, func(t *testing.T) {
			r := &pdRig{prefill: harness.StartEngineSim(t, "prefill"), decode: harness.StartEngineSim(t, "decode")}
			r.sc = harness.StartSidecar(t, r.decode.Port, "--kv-connector", spec,
				"--sglang-bootstrap-port", itoa(r.prefill.BootstrapPort), "--mooncake-bootstrap-port", itoa(r.prefill.BootstrapPort))
			for _, whole := range []bool{true, false} {
				for _, c := range bodyFieldCases(tr) {
					resp, b := exchangeRaw(t, r.sc.Port, "/v1/completions", completionBody(`,"max_tokens":4`+c.extra), r.header(), whole)
					require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s", c.name, b)
					for _, e := range []*harness.Engine{r.prefill, r.decode} {
						body := lastBody(t, e)
						assert.NotContains(t, body, itoa(tr.Port()), "%s: the client's address reached an engine: %s", c.name, body)
						for _, f := range clientFieldNames {
							assert.LessOrEqual(t, strings.Count(body, `"`+f+`"`), 1, "%s: %s twice: %s", c.name, f, body)
						}
						assert.NotContains(t, body, `\u006d`, c.name)
					}
				}
			}
			assert.Zero(t, tr.Conns(), "an engine connected to the client's address")
		})
	}
}

func TestKVFieldsTrusted(t *testing.T) {
	tr := newTrap(t)
	decode := harness.StartEngineSim(t, "decode")
	t.Run("kept", func(t *testing.T) {
		sc := harness.StartSidecar(t, decode.Port, "--trust-client-kv-params")
		for _, whole := range []bool{true, false} {
			resp, b := exchangeRaw(t, sc.Port, "/v1/completions", completionBody(`,"max_tokens":4,"ec_transfer_params":{"x":1}`), nil, whole)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			assert.Contains(t, lastBody(t, decode), `"ec_transfer_params":{"x":1}`)
		}
	})
	t.Run("ssrf refuses a disallowed address", func(t *testing.T) {
		sc := harness.StartSidecar(t, decode.Port, "--trust-client-kv-params", "--enable-ssrf-protection", "--prefiller-allowlist", "127.0.0.1:1")
		before := len(simRequests(t, decode))
		cases := bodyFieldCases(tr)
		for _, whole := range []bool{true, false} {
			for _, c := range cases {
				resp, b := exchangeRaw(t, sc.Port, "/v1/completions", completionBody(`,"max_tokens":4`+c.extra), map[string]string{"X-Request-Id": "kvt-" + strings.ReplaceAll(c.name, " ", "-")}, whole)
				require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", c.name, b)
				assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
				assert.Equal(t, int64(403), gjson.GetBytes(b, "error.code").Int())
				assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "not an allowed prefiller")
			}
		}
		assert.Len(t, simRequests(t, decode), before, "a refused request never reaches the engine")
		assert.Zero(t, tr.Conns())
		assert.Equal(t, float64(2*len(cases)), sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": "prefiller_not_allowed"}))
		assert.Contains(t, sc.Output(), `"request_id":"kvt-sglang-bootstrap"`)
	})
}

// TestKVFieldsMalformedBodyRefused: a body that is not one well-formed JSON
// object is a 400 JSON error from the sidecar before any leg, on both
// paths (the lane: the request in one write; fasthttp's: in two), with or
// without a prefiller named; the error never quotes a character the client
// did not send.
func TestKVFieldsMalformedBodyRefused(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	sc := harness.StartSidecar(t, decode.Port)
	bodies := []string{
		`{"prompt":"x","kv_transfer_params":{"remote_host":"10.0.0.1"}`,
		`{"prompt":"x"} {"kv_transfer_params":{}}`,
		`not json`,
		`{"prompt":"x",}`,
		`{"prompt":"x","max_tokens":4,"stream":tru}`,
		`[{"prompt":"x"}]`,
		`{"prompt":"x" "max_tokens":4}`,
		`{"prompt":"x\q"}`,
	}
	n := 0
	for _, hdr := range []map[string]string{nil, {"x-prefiller-host-port": prefill.HostPort()}} {
		for _, whole := range []bool{true, false} {
			for _, body := range bodies {
				resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, hdr, whole)
				require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", body, b)
				assert.Equal(t, int64(400), gjson.GetBytes(b, "error.code").Int(), "%s", body)
				assert.NotContains(t, gjson.GetBytes(b, "error.message").String(), "invalid character ','", "%s", body)
				n++
			}
		}
	}
	assert.Empty(t, simRequests(t, decode), "a malformed body never reaches the engine")
	assert.Empty(t, simRequests(t, prefill), "nor the prefiller")
	assert.Equal(t, float64(n), sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": "malformed"}))
	assert.Zero(t, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated"}))
}
