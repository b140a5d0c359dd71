package e2e

import (
	"fmt"
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

// TestSidecarDecodeFirstByteTimeout: a streamed request whose engine sends
// no head, or sends its head at once (as vLLM does) and then nothing, gets a
// 504 JSON error after --decode-first-byte-timeout — nothing of a 200 was
// sent — on the local and the disaggregated path, served by the lane (the
// request in one write) or by fasthttp (its body in a second), and the
// engine sees the request abandoned. An engine whose stream begins in time
// is not bounded after it.
func TestSidecarDecodeFirstByteTimeout(t *testing.T) {
	// No release legs for the splits' unread KV (kvrelease_test.go): they
	// would add decode legs to the engine's counts.
	rig := newRig(t, "--decode-first-byte-timeout", "300ms", "--release-kv-on-cancel=false")
	body := chatBody(`,"max_tokens":4,"stream":true`)
	cases := []struct {
		name  string
		fault string
		kind  string // the fault's sim_faults_injected_total kind
	}{
		{name: "no head", fault: `{"hang":true}`, kind: "hang"},
		// The rest would come only after a minute: an answer before that is
		// the timeout's on any machine.
		{name: "a head and nothing more", fault: `{"after_head_ms":60000}`, kind: "after_head"},
	}
	n := 0.0
	for _, tc := range cases {
		for _, pd := range []bool{false, true} {
			for _, whole := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/pd=%v/whole=%v", tc.name, pd, whole), func(t *testing.T) {
					hdr := map[string]string(nil)
					if pd {
						hdr = rig.header()
						setFault(t, rig.decode, strings.TrimSuffix(tc.fault, "}")+`,"only":"decode"}`)
					} else {
						setFault(t, rig.decode, tc.fault)
					}
					faults := rig.decode.Metric(t, "sim_faults_injected_total", map[string]string{"kind": tc.kind})
					start := time.Now()
					resp, b := exchangeRaw(t, rig.sc.Port, "/v1/chat/completions", body, hdr, whole)
					took := time.Since(start)
					require.Equal(t, http.StatusGatewayTimeout, resp.StatusCode, "%s", b)
					assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
					assert.Equal(t, int64(504), gjson.GetBytes(b, "error.code").Int(), "%s", b)
					assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "--decode-first-byte-timeout")
					assert.GreaterOrEqual(t, took, 300*time.Millisecond, "never before the timeout")
					assert.Less(t, took, 300*time.Millisecond+15*time.Second, "by the timeout, not by the engine")
					n++
					assert.Equal(t, n, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"code": "504"}))
					assert.Equal(t, faults+1, rig.decode.Metric(t, "sim_faults_injected_total", map[string]string{"kind": tc.kind}), "the engine got the request")
					harness.Eventually(t, 30*time.Second, "the engine saw it abandoned", func() bool {
						return running(t, rig.decode) == 0 && rig.decode.Metric(t, "vllm:num_requests_waiting", nil) == 0
					})
					assert.Zero(t, rig.decode.Metric(t, "vllm:generation_tokens_total", nil), "and made nothing")
				})
			}
		}
	}
	assert.Equal(t, 4.0, rig.scMetric(t, laneRequests, nil), "the whole requests were the lane's")

	// A stream that begins in time (its first event 200 ms after the
	// request, 1.8 s inside a 2 s timeout: clear of any machine's lateness)
	// is not bounded after it: its 1,000 tokens, 2.5 ms apart, run past the
	// 2 s (paced by the engine, so on any machine).
	const inTime = 2 * time.Second
	paced := &pdRig{decode: harness.StartEngineSim(t, "decode", "--decode-us-per-token", "2500")}
	paced.sc = harness.StartSidecar(t, paced.decode.Port, "--decode-first-byte-timeout", inTime.String(), "--release-kv-on-cancel=false")
	setFault(t, paced.decode, `{"after_head_ms":200}`)
	long := chatBody(`,"max_tokens":1000,"stream":true,"stream_options":{"include_usage":true}`)
	for _, whole := range []bool{true, false} {
		start := time.Now()
		resp, b := exchangeRaw(t, paced.sc.Port, "/v1/chat/completions", long, nil, whole)
		require.Equal(t, http.StatusOK, resp.StatusCode, "whole: %v", whole)
		assert.Greater(t, time.Since(start), inTime, "the stream ran past the timeout")
		assert.Contains(t, string(b), `"completion_tokens":1000`, "whole: %v", whole)
		assert.True(t, strings.HasSuffix(strings.TrimSpace(string(b)), "data: [DONE]"), "whole: %v", whole)
		assert.NotContains(t, string(b), `"error"`, "whole: %v", whole)
	}

	// A JSON (non-streamed) answer is never bounded by it: the engine sends
	// its head only with the whole answer.
	setFault(t, rig.decode, `{"latency_ms":600}`)
	st, b, _ := scPost(t, rig.sc.URL()+"/v1/chat/completions", chatBody(`,"max_tokens":4`), nil)
	require.Equal(t, http.StatusOK, st, "%s", b)
}

// TestSidecarSIGTERMUnderLoad: SIGTERM while 60 streams (local and
// disaggregated) are in flight; every one finishes in full, token-exact,
// within the grace period, and the sidecar exits 0.
func TestSidecarSIGTERMUnderLoad(t *testing.T) {
	rig := newRig(t, "--shutdown-grace", "20s")
	const n, tokens = 60, 200
	body := completionBody(`,"max_tokens":` + itoa(tokens) + `,"stream":true`)
	st, want, _ := scStream(t, rig.sc.URL()+"/v1/completions", body, nil)
	require.Equal(t, http.StatusOK, st)
	require.NotEmpty(t, want)

	type result struct {
		text string
		done bool
		err  error
	}
	results := make(chan result, n)
	started := make(chan struct{}, n)
	for i := range n {
		hdr := map[string]string(nil)
		if i%2 == 1 {
			hdr = rig.header()
		}
		go func() {
			br, cancel := openStream(t, rig.sc.URL()+"/v1/completions", body, hdr, 1)
			defer cancel()
			started <- struct{}{}
			rest, err := io.ReadAll(br)
			s := string(rest)
			results <- result{text: streamedText(s), done: strings.HasSuffix(strings.TrimSpace(s), "data: [DONE]"), err: err}
		}()
	}
	wait := func(what string) {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	for range n {
		wait("the streams to start")
	}
	require.NoError(t, rig.sc.Signal(syscall.SIGTERM))
	var complete, exact int
	for range n {
		var r result
		select {
		case r = <-results:
		case <-time.After(30 * time.Second):
			t.Fatal("timed out waiting for the streams to drain")
		}
		require.NoError(t, r.err)
		if r.done {
			complete++
		}
		if len(strings.Fields(r.text)) == tokens-1 && strings.HasSuffix(want, r.text) {
			exact++
		}
	}
	assert.Equal(t, n, complete, "every in-flight stream drained to [DONE]")
	assert.Equal(t, n, exact, "and carried the right tokens")
	code, err := rig.sc.Wait(20 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	_, err = http.Get(rig.sc.URL() + "/health")
	assert.Error(t, err, "a drained sidecar takes no new connections")
}

// streamedText concatenates the "text" of every completions event in s.
func streamedText(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			b.WriteString(gjson.Get(data, "choices.0.text").String())
		}
	}
	return b.String()
}

// TestSidecarStreamEndsBeforeAnyEvent: an engine that sends a stream's head
// and then breaks off gets the client a 502 JSON error — the head was held
// back, so no 200 went out — on the local and the disaggregated path, on
// the lane and on fasthttp's.
func TestSidecarStreamEndsBeforeAnyEvent(t *testing.T) {
	// No release legs for the splits' unread KV (kvrelease_test.go): they
	// would add decode legs to the engine's counts.
	rig := newRig(t, "--release-kv-on-cancel=false")
	body := chatBody(`,"max_tokens":4,"stream":true`)
	n := 0.0
	for _, pd := range []bool{false, true} {
		for _, whole := range []bool{true, false} {
			hdr, fault := map[string]string(nil), `{"die_after_head":true}`
			if pd {
				hdr, fault = rig.header(), `{"die_after_head":true,"only":"decode"}`
			}
			setFault(t, rig.decode, fault)
			resp, b := exchangeRaw(t, rig.sc.Port, "/v1/chat/completions", body, hdr, whole)
			n++
			assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "pd %v whole %v: %s", pd, whole, b)
			assert.Equal(t, int64(502), gjson.GetBytes(b, "error.code").Int(), "%s", b)
			assert.Equal(t, n, rig.decode.Metric(t, "sim_faults_injected_total", map[string]string{"kind": "die_after_head"}))
			assert.Equal(t, n, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"code": "502"}))
		}
	}
	assert.Equal(t, 2.0, rig.scMetric(t, laneRequests, nil), "the whole requests were the lane's")
	assert.Zero(t, rig.decode.Metric(t, "vllm:generation_tokens_total", nil))
}
