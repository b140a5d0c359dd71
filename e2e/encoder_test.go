package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// The encoder stage (llm-d's E/PD and E/P/D) over real processes: encoders
// are engine-sims of role encode, whose encodings the prefill/decode
// engines fold into their prompts, so the output tokens depend on them
// (docs/engine-sim.md, Encoder stage).

func imagePart(url string) string {
	return `{"type":"image_url","image_url":{"url":"` + url + `"}}`
}

// mmChatBody is a chat request whose user message holds a text part and
// the given content parts.
func mmChatBody(parts ...string) string {
	return `{"model":"sim-model","max_tokens":6,"messages":[{"role":"user","content":[{"type":"text","text":"describe these"},` +
		strings.Join(parts, ",") + `]}]}`
}

// referenceText is the text a lone engine (role both, no encoder, no
// sidecar) answers body with: it encodes every item itself.
func referenceText(t *testing.T, body string) string {
	t.Helper()
	ref := harness.StartEngineSim(t, "both")
	st, got, _ := scPost(t, ref.URL()+"/v1/chat/completions", body, nil)
	require.Equal(t, http.StatusOK, st, "%s", got)
	require.Equal(t, 3.0, ref.Metric(t, "sim_ec_local_encodes_total", nil), "the reference encodes its items itself")
	return textOf(got)
}

// threeImages has three distinct images and a duplicate of the first
// (deduplicated: three encoder legs).
var threeImages = []string{imagePart("http://img/a.png"), imagePart("http://img/b.png"), imagePart("http://img/a.png"), imagePart("http://img/c.png")}

// TestEncoderStageEPD: ec-nixl without a prefiller (E/PD). The three
// distinct items go to two encoders round robin (two and one), each as a
// one-item request capped at one token; the decode engine resolves all
// three items from the encoders over HTTP (encoded nothing itself) and
// answers the same tokens as a local run; the header reaches no engine.
// An encoder serving a wrong encoding changes the tokens: they depend on
// the encoder's output.
func TestEncoderStageEPD(t *testing.T) {
	body := mmChatBody(threeImages...)
	want := referenceText(t, body)
	encA := harness.StartEngineSim(t, "encode")
	encB := harness.StartEngineSim(t, "encode")
	decode := harness.StartEngineSim(t, "both")
	sc := harness.StartSidecar(t, decode.Port, "--ec-connector", "ec-nixl")
	hdr := map[string]string{"x-encoder-hosts-ports": encA.HostPort() + ", " + encB.HostPort(), "X-Request-Id": "epd-1"}

	st, got, _ := scPost(t, sc.URL()+"/v1/chat/completions", body, hdr)
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.Equal(t, want, textOf(got), "token-exact against the local run")
	assert.Equal(t, 2.0, encA.Metric(t, "sim_ec_encodes_total", nil), "items 0 and 2 on the first encoder")
	assert.Equal(t, 1.0, encB.Metric(t, "sim_ec_encodes_total", nil), "item 1 on the second")
	assert.Equal(t, 3.0, encA.Metric(t, "sim_ec_items_served_total", nil)+encB.Metric(t, "sim_ec_items_served_total", nil))
	assert.Equal(t, 3.0, decode.Metric(t, "sim_ec_loaded_items_total", map[string]string{"source": "remote"}), "the decode engine used the encoders' output")
	assert.Zero(t, decode.Metric(t, "sim_ec_local_encodes_total", nil), "and encoded nothing itself")

	legs := append(simRequests(t, encA), simRequests(t, encB)...)
	require.Len(t, legs, 3)
	for _, l := range legs {
		b := string(l.Body)
		assert.Equal(t, int64(1), gjson.Get(b, "max_tokens").Int(), b)
		assert.False(t, gjson.Get(b, "stream").Bool(), b)
		assert.Equal(t, int64(1), gjson.Get(b, "messages.#").Int(), b)
		assert.Equal(t, int64(1), gjson.Get(b, "messages.0.content.#").Int(), b)
		assert.Equal(t, "image_url", gjson.Get(b, "messages.0.content.0.type").String(), b)
		assert.Regexp(t, `^epd-1-enc-[0-2]$`, l.Headers["x-request-id"][0])
		assert.Empty(t, l.Headers["x-encoder-hosts-ports"])
	}
	dec := simRequests(t, decode)
	require.Len(t, dec, 1)
	assert.Empty(t, dec[0].Headers["x-encoder-hosts-ports"], "the header reaches no engine")
	assert.Equal(t, int64(3), gjson.GetBytes(dec[0].Body, "ec_transfer_params.@keys.#").Int(), "one entry per item, merged")
	assert.Equal(t, "0", gjson.GetBytes(dec[0].Body, "cache_hit_threshold").Raw)

	assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_encoder_stages_total", map[string]string{"outcome": "encoded"}))
	assert.Equal(t, 3.0, sc.Metric(t, "pd_sidecar_encoder_items_total", nil))
	assert.Equal(t, 3.0, sc.Metric(t, "pd_sidecar_encode_duration_seconds", map[string]string{"outcome": "ok"}))
	resp, err := http.Get(sc.URL() + "/debug/pd")
	require.NoError(t, err)
	view, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, int64(1), gjson.GetBytes(view, "window.encoder_stages.encoded").Int(), "the status view shows the stage: %s", view)

	setFault(t, encA, `{"corrupt_kv":true}`)
	st, got, _ = scPost(t, sc.URL()+"/v1/chat/completions", body, hdr)
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.NotEqual(t, want, textOf(got), "a wrong encoding gives other tokens")
}

// TestEncoderStageEPDSplit: ec-nixl with a nixlv2 split (E/P/D): the
// prefill and the decode engine both resolve the items from the encoder
// (ec_transfer_params reach both legs), the KV moves, and the text is the
// local run's.
func TestEncoderStageEPDSplit(t *testing.T) {
	body := mmChatBody(threeImages...)
	want := referenceText(t, body)
	enc := harness.StartEngineSim(t, "encode")
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	sc := harness.StartSidecar(t, decode.Port, "--ec-connector", "ec-nixl", "--kv-connector", "nixlv2")

	st, got, _ := scPost(t, sc.URL()+"/v1/chat/completions", body,
		map[string]string{"x-encoder-hosts-ports": enc.HostPort(), "x-prefiller-host-port": prefill.HostPort()})
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.Equal(t, want, textOf(got))
	assert.Equal(t, 3.0, enc.Metric(t, "sim_ec_encodes_total", nil))
	assert.Equal(t, 1.0, prefill.Metric(t, "sim_remote_decode_prefills_total", nil), "the prefiller prefilled")
	assert.Equal(t, 1.0, decode.Metric(t, "sim_remote_kv_decodes_total", nil), "the decoder decoded on its KV")
	for _, e := range []*harness.Engine{prefill, decode} {
		assert.Equal(t, 3.0, e.Metric(t, "sim_ec_loaded_items_total", map[string]string{"source": "remote"}))
		assert.Zero(t, e.Metric(t, "sim_ec_local_encodes_total", nil))
	}
	assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))

	// Streamed: the encoder legs are not (stream false), the answer is.
	streamed := strings.Replace(body, `"max_tokens":6`, `"max_tokens":6,"stream":true`, 1)
	st, text, events := scStream(t, sc.URL()+"/v1/chat/completions", streamed,
		map[string]string{"x-encoder-hosts-ports": enc.HostPort(), "x-prefiller-host-port": prefill.HostPort()})
	require.Equal(t, http.StatusOK, st)
	assert.Equal(t, "[DONE]", events[len(events)-1])
	var words string
	require.NoError(t, json.Unmarshal([]byte(want), &words))
	assert.Equal(t, words, text, "the streamed text is the local run's")
	assert.Equal(t, 6.0, enc.Metric(t, "sim_ec_encodes_total", nil))
}

// TestEncoderStageECExample: ec-example (shared encoder cache) with the
// arg lists of llm-d's e-pd and e-p-d manifests, verbatim but for the
// ports: the encoder writes the items to the shared cache, the engines
// read them there (the encoders' answers are not read), token-exact.
func TestEncoderStageECExample(t *testing.T) {
	body := mmChatBody(threeImages...)
	want := referenceText(t, body)
	for _, tc := range []struct{ name, args string }{
		{"e-pd", "--ec-connector=ec-example --secure-proxy=false --data-parallel-size=1"},
		{"e-p-d", "--kv-connector=shared-storage --ec-connector=ec-example --secure-proxy=false --data-parallel-size=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ecDir, kvDir := t.TempDir(), t.TempDir()
			enc := harness.StartEngineSim(t, "encode", "--ec-shared-dir", ecDir)
			prefill := harness.StartEngineSim(t, "prefill", "--ec-shared-dir", ecDir, "--shared-storage-dir", kvDir)
			decode := harness.StartEngineSim(t, "decode", "--ec-shared-dir", ecDir, "--shared-storage-dir", kvDir)
			if tc.name == "e-pd" {
				decode = harness.StartEngineSim(t, "both", "--ec-shared-dir", ecDir)
			}
			sc := harness.StartSidecar(t, decode.Port, strings.Fields(tc.args)...)
			hdr := map[string]string{"x-encoder-hosts-ports": enc.HostPort()}
			if tc.name == "e-p-d" {
				hdr["x-prefiller-host-port"] = prefill.HostPort()
			}
			st, got, _ := scPost(t, sc.URL()+"/v1/chat/completions", body, hdr)
			require.Equal(t, http.StatusOK, st, "%s", got)
			assert.Equal(t, want, textOf(got))
			assert.Equal(t, 3.0, enc.Metric(t, "sim_ec_encodes_total", nil))
			assert.Equal(t, 3.0, decode.Metric(t, "sim_ec_loaded_items_total", map[string]string{"source": "shared"}), "read from the shared encoder cache")
			assert.Zero(t, decode.Metric(t, "sim_ec_local_encodes_total", nil))
			dec := simRequests(t, decode)
			require.NotEmpty(t, dec)
			assert.False(t, gjson.GetBytes(dec[len(dec)-1].Body, "ec_transfer_params").Exists(), "ec-example passes no ec_transfer_params")
		})
	}
}

// TestEncoderStageFailures: an encoder that is down, or slower than
// --encoder-timeout, fails the request 502 (OpenAI JSON) under the
// default --on-encoder-failure error, before any engine leg; under local
// the request is served, the engine encoding the items itself, with the
// local run's tokens. Each is counted by reason.
func TestEncoderStageFailures(t *testing.T) {
	body := mmChatBody(threeImages...)
	want := referenceText(t, body)
	slow := harness.StartEngineSim(t, "encode", "--faults", `{"latency_ms":60000}`)
	down := "127.0.0.1:" + itoa(harness.FreePort(t)) // nothing listens
	for _, tc := range []struct {
		name, encoder, reason string
	}{
		{"down", down, "unreachable"},
		{"slow", slow.HostPort(), "timeout"},
	} {
		t.Run(tc.name+"/error", func(t *testing.T) {
			decode := harness.StartEngineSim(t, "both")
			sc := harness.StartSidecar(t, decode.Port, "--ec-connector", "ec-nixl", "--encoder-timeout", "300ms")
			start := time.Now()
			st, got, _ := scPost(t, sc.URL()+"/v1/chat/completions", body, map[string]string{"x-encoder-hosts-ports": tc.encoder})
			assert.Equal(t, http.StatusBadGateway, st, "%s", got)
			assert.Less(t, time.Since(start), 30*time.Second, "bounded by --encoder-timeout, not the encoder's 60 s")
			assert.Contains(t, gjson.GetBytes(got, "error.message").String(), "encoder request failed for item")
			assert.Empty(t, simRequests(t, decode), "no engine leg")
			assert.Positive(t, sc.Metric(t, "pd_sidecar_encoder_failures_total", map[string]string{"reason": tc.reason}))
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_encoder_stages_total", map[string]string{"outcome": "failed"}))
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "local", "code": "502"}))
		})
		t.Run(tc.name+"/local", func(t *testing.T) {
			decode := harness.StartEngineSim(t, "both")
			sc := harness.StartSidecar(t, decode.Port, "--ec-connector", "ec-nixl", "--encoder-timeout", "300ms", "--on-encoder-failure", "local")
			st, got, _ := scPost(t, sc.URL()+"/v1/chat/completions", body, map[string]string{"x-encoder-hosts-ports": tc.encoder})
			require.Equal(t, http.StatusOK, st, "%s", got)
			assert.Equal(t, want, textOf(got), "the engine encoded the items itself: the local run's tokens")
			assert.Equal(t, 3.0, decode.Metric(t, "sim_ec_local_encodes_total", nil))
			assert.Zero(t, decode.Metric(t, "sim_ec_loaded_items_total", map[string]string{"source": "remote"}))
			assert.Equal(t, 3.0, sc.Metric(t, "pd_sidecar_encoder_failures_total", map[string]string{"reason": tc.reason}))
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_encoder_stages_total", map[string]string{"outcome": "degraded"}))
		})
	}
}

// TestEncoderStageAllowlist: with SSRF protection, an encoder off the
// allowlist is dropped (never contacted, counted) and the others serve
// every item; when every encoder is refused the stage fails (502).
func TestEncoderStageAllowlist(t *testing.T) {
	body := mmChatBody(threeImages...)
	ok := harness.StartEngineSim(t, "encode")
	refused := harness.StartEngineSim(t, "encode")
	decode := harness.StartEngineSim(t, "both")
	sc := harness.StartSidecar(t, decode.Port, "--ec-connector", "ec-nixl",
		"--enable-ssrf-protection", "--prefiller-allowlist", ok.HostPort())

	st, got, _ := scPost(t, sc.URL()+"/v1/chat/completions", body, map[string]string{"x-encoder-hosts-ports": refused.HostPort() + "," + ok.HostPort()})
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.Equal(t, 3.0, ok.Metric(t, "sim_ec_encodes_total", nil), "the allowed encoder took every item")
	assert.Empty(t, simRequests(t, refused), "the refused encoder was never contacted")
	assert.Equal(t, 3.0, decode.Metric(t, "sim_ec_loaded_items_total", map[string]string{"source": "remote"}))
	assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_encoder_failures_total", map[string]string{"reason": "ssrf_denied"}))

	st, got, _ = scPost(t, sc.URL()+"/v1/chat/completions", body, map[string]string{"x-encoder-hosts-ports": refused.HostPort()})
	assert.Equal(t, http.StatusBadGateway, st, "%s", got)
	assert.Contains(t, gjson.GetBytes(got, "error.message").String(), "no encoder of x-encoder-hosts-ports is allowed")
	assert.Empty(t, simRequests(t, refused))
	assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_encoder_stages_total", map[string]string{"outcome": "failed"}))
}

// TestEncoderStageNoItems: a request without multimodal items contacts no
// encoder, and its body reaches the engine unchanged; the header is
// stripped. Without --ec-connector a multimodal request is only stripped
// of the header, too.
func TestEncoderStageNoItems(t *testing.T) {
	enc := harness.StartEngineSim(t, "encode")
	decode := harness.StartEngineSim(t, "both")
	sc := harness.StartSidecar(t, decode.Port, "--ec-connector", "ec-nixl")
	hdr := map[string]string{"x-encoder-hosts-ports": enc.HostPort()}
	body := chatBody(`,"max_tokens":4`)
	st, got, _ := scPost(t, sc.URL()+"/v1/chat/completions", body, hdr)
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.Empty(t, simRequests(t, enc), "no encoder contacted")
	dec := simRequests(t, decode)
	require.Len(t, dec, 1)
	assert.JSONEq(t, body, string(dec[0].Body), "the body is left as it is")
	assert.Empty(t, dec[0].Headers["x-encoder-hosts-ports"])
	assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_encoder_stages_total", map[string]string{"outcome": "no_items"}))

	req, err := http.NewRequest(http.MethodGet, sc.URL()+"/v1/models", nil)
	require.NoError(t, err)
	req.Header.Set("x-encoder-hosts-ports", enc.HostPort())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	all := journal(t, decode)
	require.Equal(t, "/v1/models", all[len(all)-1].Path)
	assert.Empty(t, all[len(all)-1].Headers["x-encoder-hosts-ports"], "a passthrough is stripped of the header too")

	off := harness.StartSidecar(t, decode.Port)
	st, got, _ = scPost(t, off.URL()+"/v1/chat/completions", mmChatBody(threeImages...), hdr)
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.Empty(t, simRequests(t, enc), "the stage is off")
	dec = simRequests(t, decode)
	assert.Empty(t, dec[len(dec)-1].Headers["x-encoder-hosts-ports"], "the header is stripped all the same")
	assert.Equal(t, 3.0, decode.Metric(t, "sim_ec_local_encodes_total", nil))
}

// TestEncoderStageTraced: each encoder leg is an "encode" span of the
// request's trace, whose context the encoder receives in traceparent.
func TestEncoderStageTraced(t *testing.T) {
	clearOTELEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "console")
	enc := harness.StartEngineSim(t, "encode")
	decode := harness.StartEngineSim(t, "both")
	sc := harness.StartSidecar(t, decode.Port, "--ec-connector", "ec-nixl")
	const trace = "4ef7651916cd43dd8448eb211c80319a"
	st, got, _ := scPost(t, sc.URL()+"/v1/chat/completions", mmChatBody(imagePart("http://img/a.png"), imagePart("http://img/b.png")),
		map[string]string{"x-encoder-hosts-ports": enc.HostPort(), "traceparent": "00-" + trace + "-f7ad6b7169203335-01"})
	require.Equal(t, http.StatusOK, st, "%s", got)
	legs := simRequests(t, enc)
	require.Len(t, legs, 2)
	for _, l := range legs {
		require.NotEmpty(t, l.Headers["traceparent"])
		assert.Contains(t, l.Headers["traceparent"][0], trace, "the encoder leg carries the request's trace")
	}
	require.NoError(t, sc.Signal(syscall.SIGTERM))
	_, err := sc.Wait(15 * time.Second)
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(sc.Output(), "\n") {
		var span struct {
			Name        string
			SpanContext struct{ TraceID string }
		}
		if json.Unmarshal([]byte(line), &span) == nil && span.SpanContext.TraceID == trace && span.Name == "encode" {
			n++
		}
	}
	assert.Equal(t, 2, n, "one encode span per item:\n%s", sc.Output())
}
