package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// These tests run pd-sidecar with each non-default connector (sglang,
// mooncake, shared-storage, offloading) between two engine-sim processes and prove the
// split with the simulators' proof counters and token-exact output.

// connRig is a prefill engine, a decode engine, a reference engine (local
// runs, no shared store) and a sidecar speaking one connector.
type connRig struct {
	pdRig
	ref  *harness.Engine
	spec connSpec
}

// connSpec is what differs between connectors in these tests.
type connSpec struct {
	name string
	// extra is appended to every client body (shared-storage: decode first).
	extra string
	// proof names the counters that move, on each engine, when one split
	// really happened.
	prefillProof, decodeProof string
}

var connSpecs = []connSpec{
	{name: "sglang", prefillProof: "sim_sglang_prefills_total", decodeProof: "sim_sglang_decodes_total"},
	{name: "mooncake", prefillProof: "sim_mooncake_prefills_total", decodeProof: "sim_mooncake_decodes_total"},
	{name: "shared-storage", extra: `,"cache_hit_threshold":0.8`, prefillProof: "sim_shared_storage_stored_blocks_total", decodeProof: "sim_shared_storage_loads_total"},
	{name: "offloading", prefillProof: "sim_p2p_holds_total", decodeProof: "sim_p2p_pulls_total"},
}

// newConnRig starts the engines (engine flags apply to both P and D) and a
// sidecar speaking spec's connector in front of the decode engine.
func newConnRig(t *testing.T, spec connSpec, sidecarFlags []string, engineFlags ...string) *connRig {
	t.Helper()
	if spec.name == "shared-storage" {
		engineFlags = append(engineFlags, "--shared-storage-dir", t.TempDir())
	}
	r := &connRig{spec: spec, ref: harness.StartEngineSim(t, "both")}
	r.prefill = harness.StartEngineSim(t, "prefill", engineFlags...)
	r.decode = harness.StartEngineSim(t, "decode", engineFlags...)
	flags := append([]string{"--kv-connector", spec.name,
		"--sglang-bootstrap-port", itoa(r.prefill.BootstrapPort),
		"--mooncake-bootstrap-port", itoa(r.prefill.BootstrapPort),
		"--p2p-connector-port", itoa(r.prefill.P2PPort)}, sidecarFlags...)
	r.sc = harness.StartSidecar(t, r.decode.Port, flags...)
	return r
}

// pathCase is one inference path with a body builder (prompt differs per
// path, so the shared store never serves one path from another's KV).
type pathCase struct {
	path string
	body func(extra string) string
}

func pathCases() []pathCase {
	p := func(tag string) string { return quote(simPrompt + " " + tag) }
	return []pathCase{
		{"/v1/completions", func(x string) string {
			return `{"model":"sim-model","prompt":` + p("completions") + `,"max_tokens":7` + x + `}`
		}},
		{"/v1/chat/completions", func(x string) string {
			return `{"model":"sim-model","messages":[{"role":"user","content":` + p("chat") + `}],"max_tokens":7,"max_completion_tokens":7` + x + `}`
		}},
		{"/v1/responses", func(x string) string {
			return `{"model":"sim-model","input":` + p("responses") + `,"max_output_tokens":7` + x + `}`
		}},
		{"/v1/messages", func(x string) string {
			return `{"model":"sim-model","max_tokens":7,"messages":[{"role":"user","content":` + p("messages") + `}]` + x + `}`
		}},
		{"/inference/v1/generate", func(x string) string {
			return `{"model":"sim-model","token_ids":[5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24],"sampling_params":{"max_tokens":7}` + x + `}`
		}},
	}
}

// refText is the output of a local run on the reference engine.
func (r *connRig) refText(t *testing.T, path, body string) string {
	t.Helper()
	body = strings.Replace(body, `"cache_hit_threshold":0.8`, `"cache_hit_threshold":0`, 1)
	st, b, _ := scPost(t, r.ref.URL()+path, body, nil)
	require.Equal(t, http.StatusOK, st, "%s", b)
	require.NotEmpty(t, textOf(b))
	return textOf(b)
}

func TestConnectorsSplitEveryAPI(t *testing.T) {
	for _, spec := range connSpecs {
		t.Run(spec.name, func(t *testing.T) {
			r := newConnRig(t, spec, nil)
			for i, c := range pathCases() {
				body := c.body(spec.extra)
				want := r.refText(t, c.path, body)
				st, got, _ := scPost(t, r.sc.URL()+c.path, body, r.header())
				require.Equal(t, http.StatusOK, st, "%s %s", c.path, got)
				assert.Equal(t, want, textOf(got), "%s: token-exact", c.path)
				n := float64(i + 1)
				assert.Equal(t, n, r.decode.Metric(t, spec.decodeProof, nil), "%s: decode used the prefiller's KV", c.path)
				assert.Positive(t, r.prefill.Metric(t, spec.prefillProof, nil), c.path)
				assert.Equal(t, n, r.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}), c.path)
			}
			st, text, events := scStream(t, r.sc.URL()+"/v1/chat/completions",
				chatBody(`,"max_tokens":9,"stream":true`+spec.extra), r.header())
			require.Equal(t, http.StatusOK, st)
			assert.Equal(t, r.streamRef(t), text, "streamed: token-exact")
			assert.Equal(t, "[DONE]", events[len(events)-1])
			assert.Equal(t, 6.0, r.decode.Metric(t, spec.decodeProof, nil))
			assert.Zero(t, r.scMetric(t, "pd_sidecar_fallbacks_total", nil))
			harness.Eventually(t, 30*time.Second, "no KV left held on the prefiller", func() bool {
				return r.prefill.Metric(t, "sim_kv_blocks_held", nil) == 0
			})
		})
	}
}

// streamRef is the streamed chat reference text.
func (r *connRig) streamRef(t *testing.T) string {
	t.Helper()
	st, text, _ := scStream(t, r.ref.URL()+"/v1/chat/completions", chatBody(`,"max_tokens":9,"stream":true`), nil)
	require.Equal(t, http.StatusOK, st)
	return text
}

func TestConnectorsPrefillerDeadFallsBackLocally(t *testing.T) {
	for _, spec := range connSpecs {
		t.Run(spec.name, func(t *testing.T) {
			r := newConnRig(t, spec, nil)
			body := completionBody(`,"max_tokens":6` + spec.extra)
			want := r.refText(t, "/v1/completions", body)
			dead := map[string]string{"x-prefiller-host-port": harness.HostPort(harness.FreePort(t))}
			st, got, _ := scPost(t, r.sc.URL()+"/v1/completions", body, dead)
			require.Equal(t, http.StatusOK, st, "%s", got)
			assert.Equal(t, want, textOf(got))
			assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "unreachable"}))
			assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "fallback", "code": "200"}))
			assert.Zero(t, r.decode.Metric(t, spec.decodeProof, nil))
			assert.Zero(t, r.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
		})
	}
}

// TestConnectorsDecodeDeadIs503: with the local engine dead, the request
// is answered 503 and nothing stays held on the prefiller. The prefill is
// made slow (about 0.2 s) so that, under a concurrent choreography, the
// failed decode leg's cancellation reaches it mid-prefill: a prefill that
// finished first would hold its KV for the decoder's pull until its lease
// ran out, which is the engine's behaviour, not a leak.
func TestConnectorsDecodeDeadIs503(t *testing.T) {
	for _, spec := range connSpecs {
		t.Run(spec.name, func(t *testing.T) {
			r := newConnRig(t, spec, nil, "--prefill-us-per-token", "2000")
			dead := harness.StartSidecar(t, harness.FreePort(t), "--kv-connector", spec.name,
				"--sglang-bootstrap-port", itoa(r.prefill.BootstrapPort), "--mooncake-bootstrap-port", itoa(r.prefill.BootstrapPort))
			st, b, _ := scPost(t, dead.URL()+"/v1/completions", completionBody(`,"max_tokens":4`+spec.extra), r.header())
			assert.Equal(t, http.StatusServiceUnavailable, st, "%s", b)
			assert.Equal(t, int64(503), gjson.GetBytes(b, "error.code").Int(), "%s", b)
			harness.Eventually(t, 30*time.Second, "the prefill leg was cancelled and its KV freed", func() bool {
				return r.prefill.Metric(t, "sim_kv_blocks_held", nil) == 0 && running(t, r.prefill) == 0
			})
		})
	}
}

func TestConnectorsClientCancelCancelsBothLegs(t *testing.T) {
	for _, spec := range connSpecs {
		t.Run(spec.name, func(t *testing.T) {
			r := newConnRig(t, spec, nil)
			// The decode engine is slow to start, so the client leaves while
			// both legs are in flight (shared-storage: while the prefill is).
			// An offloading prefill answers as soon as it holds the blocks,
			// and the hold then waits for the decoder or the engine's lease,
			// so there the prefill is the slow leg: the client leaves while
			// it runs and the decode waits on the P2P pull.
			prefillSlow := spec.name == "shared-storage" || spec.name == "offloading"
			if prefillSlow {
				setFault(t, r.prefill, `{"latency_ms":3000}`)
			} else {
				setFault(t, r.decode, `{"latency_ms":3000}`)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.sc.URL()+"/v1/completions",
				strings.NewReader(completionBody(`,"max_tokens":6`+spec.extra)))
			require.NoError(t, err)
			req.Header.Set("x-prefiller-host-port", r.prefill.HostPort())
			_, err = http.DefaultClient.Do(req)
			require.Error(t, err, "the client gave up")
			harness.Eventually(t, 30*time.Second, "both legs cancelled, no KV held", func() bool {
				return running(t, r.prefill) == 0 && running(t, r.decode) == 0 &&
					r.prefill.Metric(t, "sim_kv_blocks_held", nil) == 0 &&
					r.scMetric(t, "pd_sidecar_client_disconnects_total", nil) == 1
			})
			if spec.name == "offloading" {
				assert.Zero(t, r.prefill.Metric(t, "sim_p2p_holds_total", nil), "the prefill was cancelled before it held anything")
				assert.Zero(t, r.decode.Metric(t, "sim_p2p_pulls_total", nil))
			}
			if !prefillSlow {
				assert.Equal(t, 1.0, r.prefill.Metric(t, "sim_kv_released_on_cancel_total", nil),
					"the prefill leg was cancelled while holding KV, and the KV was freed at once")
			}
			assert.Zero(t, r.prefill.Metric(t, "sim_kv_lease_expired_total", nil))
			assert.Zero(t, r.scMetric(t, "pd_sidecar_prefill_leg_failures_total", nil), "our own cancel is no prefill failure")
		})
	}
}

func TestConnectorSGLangRefusesNAbove1(t *testing.T) {
	r := newConnRig(t, connSpecs[0], nil)
	st, b, _ := scPost(t, r.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4,"n":2`), r.header())
	assert.Equal(t, http.StatusBadRequest, st)
	assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "n=2")
	assert.Empty(t, simRequests(t, r.prefill), "no leg sent")
	assert.Empty(t, simRequests(t, r.decode), "no leg sent")
}

func TestConnectorSharedStorageDecodeFirstServedFromCache(t *testing.T) {
	r := newConnRig(t, connSpecs[2], nil)
	body := completionBody(`,"max_tokens":5,"cache_hit_threshold":0.8`)
	st, first, _ := scPost(t, r.sc.URL()+"/v1/completions", body, r.header())
	require.Equal(t, http.StatusOK, st, "%s", first)
	st, again, _ := scPost(t, r.sc.URL()+"/v1/completions", body, r.header())
	require.Equal(t, http.StatusOK, st, "%s", again)
	assert.Equal(t, textOf(first), textOf(again))
	assert.Len(t, simRequests(t, r.prefill), 1, "the second request needed no prefill")
	assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_decode_first_total", map[string]string{"outcome": "served"}))
	assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_decode_first_total", map[string]string{"outcome": "declined"}))
}

// TestConnectorSharedStorageDecodeFirstTimesOut: the decode-first leg is a
// streamed request to the local engine like any other: a head and nothing
// more within --decode-first-byte-timeout is a 504 JSON, and the engine sees
// it abandoned.
func TestConnectorSharedStorageDecodeFirstTimesOut(t *testing.T) {
	r := newConnRig(t, connSpecs[2], []string{"--decode-first-byte-timeout", "300ms"})
	setFault(t, r.decode, `{"after_head_ms":60000}`)
	body := completionBody(`,"max_tokens":5,"stream":true,"cache_hit_threshold":0.8`)
	start := time.Now()
	st, b, _ := scPost(t, r.sc.URL()+"/v1/completions", body, r.header())
	require.Equal(t, http.StatusGatewayTimeout, st, "%s", b)
	assert.Equal(t, int64(504), gjson.GetBytes(b, "error.code").Int(), "%s", b)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	assert.Less(t, time.Since(start), 30*time.Second, "the timeout answered, not the engine (60 s)")
	assert.Equal(t, 1.0, r.decode.Metric(t, "sim_faults_injected_total", map[string]string{"kind": "after_head"}))
	assert.Empty(t, simRequests(t, r.prefill), "no prefill was tried")
	harness.Eventually(t, 30*time.Second, "the engine saw it abandoned", func() bool {
		return r.decode.Metric(t, "vllm:num_requests_waiting", nil) == 0
	})
	assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_requests_total", map[string]string{"code": "504"}))
}

// TestConnectorsLLMDRequestShapes drives the sidecar with the request
// shapes llm-d's pd-sidecar uses for each connector (its connector tests'
// bodies) and checks each leg the engines received against what llm-d
// sends: SGLang's one body with bootstrap_host/port/room on both legs,
// Mooncake's kv_transfer_params pair tied by transfer_id, and
// shared-storage's decode-first, prefill with cache_hit_threshold 0 and
// second decode.
func TestConnectorsLLMDRequestShapes(t *testing.T) {
	chat := `{"model":"sim-model","messages":[{"role":"user","content":` + quote(simPrompt) + `}],"max_tokens":8,"stream":true}`
	t.Run("sglang", func(t *testing.T) {
		r := newConnRig(t, connSpecs[0], nil)
		st, _, _ := scStream(t, r.sc.URL()+"/v1/chat/completions", chat, r.header())
		require.Equal(t, http.StatusOK, st)
		pre, dec := simRequests(t, r.prefill), simRequests(t, r.decode)
		require.Len(t, pre, 1)
		require.Len(t, dec, 1)
		assert.JSONEq(t, string(pre[0].Body), string(dec[0].Body), "one body for both legs")
		b := string(dec[0].Body)
		assert.Equal(t, "127.0.0.1", gjson.Get(b, "bootstrap_host").String())
		assert.Equal(t, int64(r.prefill.BootstrapPort), gjson.Get(b, "bootstrap_port").Int())
		room := gjson.Get(b, "bootstrap_room")
		assert.Equal(t, gjson.Number, room.Type)
		assert.Less(t, room.Uint(), uint64(1)<<63)
		assert.Equal(t, int64(8), gjson.Get(b, "max_tokens").Int(), "no cap on the prefill leg")
		assert.True(t, gjson.Get(b, "stream").Bool())
	})
	t.Run("mooncake", func(t *testing.T) {
		r := newConnRig(t, connSpecs[1], nil)
		st, _, _ := scStream(t, r.sc.URL()+"/v1/chat/completions", chat, r.header())
		require.Equal(t, http.StatusOK, st)
		q, err := http.Get("http://" + harness.HostPort(r.prefill.BootstrapPort) + "/query")
		require.NoError(t, err)
		var m map[string]map[string]any
		require.NoError(t, jsonDecode(q, &m))
		q.Body.Close()
		pre, dec := simRequests(t, r.prefill), simRequests(t, r.decode)
		require.Len(t, pre, 1)
		require.Len(t, dec, 1)
		xfer := gjson.GetBytes(pre[0].Body, "kv_transfer_params.transfer_id").String()
		assert.True(t, strings.HasPrefix(xfer, "xfer-"), xfer)
		assert.JSONEq(t, `{"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":`+quote(xfer)+`}`,
			gjson.GetBytes(pre[0].Body, "kv_transfer_params").Raw)
		assert.Equal(t, int64(1), gjson.GetBytes(pre[0].Body, "max_tokens").Int())
		assert.False(t, gjson.GetBytes(pre[0].Body, "stream").Bool())
		assert.JSONEq(t, `{"do_remote_prefill":true,"do_remote_decode":false,"transfer_id":`+quote(xfer)+
			`,"remote_bootstrap_addr":`+quote("http://"+harness.HostPort(r.prefill.BootstrapPort))+
			`,"remote_engine_id":`+quote(m["0"]["engine_id"].(string))+`}`,
			gjson.GetBytes(dec[0].Body, "kv_transfer_params").Raw)
		assert.True(t, gjson.GetBytes(dec[0].Body, "stream").Bool())
	})
	t.Run("offloading", func(t *testing.T) {
		r := newConnRig(t, connSpecs[3], nil)
		st, _, _ := scStream(t, r.sc.URL()+"/v1/chat/completions", chat, r.header())
		require.Equal(t, http.StatusOK, st)
		pre, dec := simRequests(t, r.prefill), simRequests(t, r.decode)
		require.Len(t, pre, 1)
		require.Len(t, dec, 1)
		id := gjson.GetBytes(pre[0].Body, "kv_transfer_params.remote_decoder.kv_request_id").String()
		assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
		assert.JSONEq(t, `{"remote_decoder":{"kv_request_id":`+quote(id)+`}}`, gjson.GetBytes(pre[0].Body, "kv_transfer_params").Raw)
		assert.Equal(t, int64(1), gjson.GetBytes(pre[0].Body, "max_tokens").Int())
		assert.False(t, gjson.GetBytes(pre[0].Body, "stream").Bool())
		assert.JSONEq(t, `{"remote_prefiller":{"kv_request_id":`+quote(id)+`,"remote_host":"127.0.0.1","remote_port":`+itoa(r.prefill.P2PPort)+`}}`,
			gjson.GetBytes(dec[0].Body, "kv_transfer_params").Raw)
		assert.Equal(t, int64(8), gjson.GetBytes(dec[0].Body, "max_tokens").Int(), "the decode leg keeps the client's cap")
		assert.True(t, gjson.GetBytes(dec[0].Body, "stream").Bool())
	})
	t.Run("shared-storage", func(t *testing.T) {
		r := newConnRig(t, connSpecs[2], nil)
		body := `{"model":"sim-model","messages":[{"role":"user","content":` + quote(simPrompt) + `}],"stream":true,"cache_hit_threshold":0.5}`
		st, _, _ := scStream(t, r.sc.URL()+"/v1/chat/completions", body, r.header())
		require.Equal(t, http.StatusOK, st)
		pre, dec := simRequests(t, r.prefill), simRequests(t, r.decode)
		require.Len(t, pre, 1)
		require.Len(t, dec, 2, "decode first, then decode again")
		assert.JSONEq(t, body, string(dec[0].Body), "the first decode is the client's body")
		assert.Equal(t, 0.0, gjson.GetBytes(pre[0].Body, "cache_hit_threshold").Float())
		assert.Equal(t, int64(1), gjson.GetBytes(pre[0].Body, "max_tokens").Int())
		assert.False(t, gjson.GetBytes(pre[0].Body, "stream").Bool())
		assert.Equal(t, `0`, gjson.GetBytes(dec[1].Body, "cache_hit_threshold").Raw)
		assert.True(t, gjson.GetBytes(dec[1].Body, "stream").Bool())
	})
}
