package enginesim

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func setFaults(t *testing.T, s *testSim, body string) {
	t.Helper()
	a := post(t, s.url+"/sim/faults", body)
	require.Equal(t, 200, a.status, "%s", a.body)
}

const smallCompletion = `{"model":"sim-model","prompt":"fault test","max_tokens":3}`

func TestFaultRefuse(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"refuse":true}`)
	_, err := http.Post(s.url+"/v1/completions", "application/json", strings.NewReader(smallCompletion))
	require.Error(t, err, "the connection is reset without an answer")
	req, _ := http.NewRequest(http.MethodDelete, s.url+"/sim/faults", nil)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "control routes still answer")
	resp.Body.Close()
	assert.Equal(t, 200, post(t, s.url+"/v1/completions", smallCompletion).status, "cleared")
}

func TestFaultHang(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"hang":true}`)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/completions", strings.NewReader(smallCompletion))
	_, err := http.DefaultClient.Do(req)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, 0.0, s.metric(t, "vllm:num_requests_running"))
}

func TestFaultStatus(t *testing.T) {
	for _, code := range []int{500, 429, 400, 503} {
		s := startSim(t, RoleBoth, nil)
		setFaults(t, s, `{"status":`+mustJSON(code)+`}`)
		a := post(t, s.url+"/v1/completions", smallCompletion)
		assert.Equal(t, code, a.status)
		assert.EqualValues(t, code, get(a.json, "error", "code"))
	}
}

func TestFaultDieAfterChunks(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"die_after_chunks":2}`)
	_, evs, err := stream(t, s.url+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"max_tokens":5,"stream":true}`)
	require.Error(t, err, "the stream is cut, not ended")
	assert.Len(t, evs, 2)
	for _, e := range evs {
		assert.NotEqual(t, "[DONE]", e.data)
	}
	resp, err := http.Post(s.url+"/v1/completions", "application/json", strings.NewReader(smallCompletion))
	require.NoError(t, err, "the JSON answer's headers arrive")
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "a JSON answer is cut halfway")
}

func TestFaultLatency(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"latency_ms":60}`)
	start := time.Now()
	a := post(t, s.url+"/v1/completions", smallCompletion)
	assert.Equal(t, 200, a.status)
	assert.GreaterOrEqual(t, time.Since(start), 60*time.Millisecond)
}

// TestFaultHoldUntilSet: a held request is answered once the plan is set
// again, under the plan it came with; not before.
func TestFaultHoldUntilSet(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"hold_until_set":true,"eos_first_token":true}`)
	done := make(chan answer, 1)
	go func() { done <- post(t, s.url+"/v1/completions", smallCompletion) }()
	require.Eventually(t, func() bool { return s.kindMetric(t, "sim_faults_injected_total", "hold") == 1 }, 30*time.Second, time.Millisecond)
	select {
	case a := <-done:
		t.Fatalf("answered while held: %d %s", a.status, a.body)
	default:
	}
	setFaults(t, s, `{}`)
	a := <-done
	assert.Equal(t, 200, a.status)
	assert.Equal(t, "stop", get(a.json, "choices", 0, "finish_reason"), "served under the plan it came with")
	assert.Equal(t, 200, post(t, s.url+"/v1/completions", smallCompletion).status, "the next is not held")
}

func TestFaultEOSFirstToken(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"eos_first_token":true}`)
	a := post(t, s.url+"/v1/completions", smallCompletion)
	assert.Equal(t, "stop", get(a.json, "choices", 0, "finish_reason"))
	assert.EqualValues(t, 1, get(a.json, "usage", "completion_tokens"))
	assert.Equal(t, "", get(a.json, "choices", 0, "text"))
}

func TestFaultOnlyAndTimes(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"status":503,"only":"prefill","times":2}`)
	assert.Equal(t, 200, post(t, s.url+"/v1/completions", smallCompletion).status, "a local request is not a prefill leg")
	prefill := `{"model":"sim-model","prompt":"fault test","max_tokens":1,` + prefillKV + `}`
	assert.Equal(t, 503, post(t, s.url+"/v1/completions", prefill).status)
	assert.Equal(t, 503, post(t, s.url+"/v1/completions", prefill).status)
	assert.Equal(t, 200, post(t, s.url+"/v1/completions", prefill).status, "cleared after two")
	assert.Equal(t, 2.0, s.metric(t, "sim_faults_injected_total"))
}

func TestFaultValidation(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	for _, bad := range []string{`{"status":200}`, `{"only":"sideways"}`, `{"nonsense":true}`, `{"times":-1}`, `[`} {
		a := post(t, s.url+"/sim/faults", bad)
		assert.Equal(t, 400, a.status, bad)
	}
}

// TestStreamHeadComesFirst: a stream's head is sent before the engine makes
// its first token, as uvicorn writes a StreamingResponse's head; after_head_ms
// holds the rest back.
func TestStreamHeadComesFirst(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"after_head_ms":300}`)
	resp, err := http.Post(s.url+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"sim-model","prompt":"x","max_tokens":3,"stream":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Zero(t, s.metric(t, "vllm:generation_tokens_total"), "the head came before any token")
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Contains(t, string(b), "data: [DONE]")
	assert.Equal(t, 3.0, s.metric(t, "vllm:generation_tokens_total"))
	assert.Equal(t, 1.0, s.metric(t, "sim_faults_injected_total"))
}
