package e2e

import (
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

// TestSidecarDecodeFirstByteTimeout: a local engine that accepts a streamed
// request and never answers gets a 504 JSON error after
// --decode-first-byte-timeout, on the local and the disaggregated path, and
// the engine sees the request abandoned.
func TestSidecarDecodeFirstByteTimeout(t *testing.T) {
	rig := newRig(t, "--decode-first-byte-timeout", "300ms")
	setFault(t, rig.decode, `{"hang":true}`)
	body := chatBody(`,"max_tokens":4,"stream":true`)
	for _, hdr := range []map[string]string{nil, rig.header()} {
		start := time.Now()
		st, b, _ := scPost(t, rig.sc.URL()+"/v1/chat/completions", body, hdr)
		took := time.Since(start)
		require.Equal(t, http.StatusGatewayTimeout, st, "%s", b)
		assert.Equal(t, int64(504), gjson.GetBytes(b, "error.code").Int(), "%s", b)
		assert.GreaterOrEqual(t, took, 300*time.Millisecond)
		assert.Less(t, took, 10*time.Second)
	}
	assert.Equal(t, 2.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"code": "504"}))
	harness.Eventually(t, 5*time.Second, "the hung engine saw both requests abandoned", func() bool {
		return rig.decode.Metric(t, "sim_faults_injected_total", map[string]string{"kind": "hang"}) == 2 && running(t, rig.decode) == 0
	})

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
