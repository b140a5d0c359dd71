package enginesim

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inflight is a request whose client can leave at any time.
type inflight struct {
	cancel context.CancelFunc
	// head is closed once the answer's head arrived (or the request
	// failed); done once the client is finished.
	head, done chan struct{}
}

func send(t *testing.T, url, body string) *inflight {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	f := &inflight{cancel: cancel, head: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		resp, err := http.DefaultClient.Do(req)
		close(f.head)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-f.done
	})
	return f
}

// leave cancels the request and waits for its client to finish.
func (f *inflight) leave() {
	f.cancel()
	<-f.done
}

// silentPrefiller is a KV side channel that accepts pulls and never
// answers; it returns its port.
func silentPrefiller(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	conns := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for c := range conns {
			c.Close()
		}
	})
	return l.Addr().(*net.TCPAddr).Port
}

func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 30*time.Second, time.Millisecond, msg)
}

// TestCancelledRequests: a client that leaves before its answer stops the
// request at once, wherever it waits, frees what it held and is counted
// once by its leg kind.
func TestCancelledRequests(t *testing.T) {
	stream := func(body string) string { return strings.TrimSuffix(body, "}") + `,"stream":true}` }
	cases := []struct {
		name   string
		role   Role
		mutate func(*Config)
		faults string
		// run sends the request(s), makes the client leave and returns
		// the requests still in flight.
		run  func(t *testing.T, s *testSim) []*inflight
		kind string
		// prefills is sim_remote_decode_prefills_total at the end.
		prefills float64
	}{
		{
			name: "prefill leg mid slow delay", role: RoleBoth, kind: "prefill",
			faults: `{"slow_share":1,"slow_ms":10000,"only":"prefill"}`,
			run: func(t *testing.T, s *testSim) []*inflight {
				f := send(t, s.url+"/v1/completions", prefillCompletion)
				eventually(t, func() bool { return s.kindMetric(t, "sim_faults_injected_total", "slow") == 1 }, "the delay began")
				f.leave()
				return nil
			},
		},
		{
			name: "prefill leg mid prefill", role: RolePrefill, kind: "prefill",
			mutate: func(c *Config) { c.PrefillPerToken = 5 * time.Second },
			run: func(t *testing.T, s *testSim) []*inflight {
				f := send(t, s.url+"/v1/completions", prefillCompletion)
				eventually(t, func() bool { return s.metric(t, "vllm:num_requests_running") == 1 }, "prefilling")
				f.leave()
				return nil
			},
		},
		{
			name: "local stream before its first event", role: RoleBoth, kind: "local",
			mutate: func(c *Config) { c.PrefillPerToken = 5 * time.Second },
			run: func(t *testing.T, s *testSim) []*inflight {
				f := send(t, s.url+"/v1/completions", stream(smallCompletion))
				<-f.head
				eventually(t, func() bool { return s.metric(t, "vllm:num_requests_running") == 1 }, "prefilling")
				f.leave()
				assert.Zero(t, s.metric(t, "vllm:generation_tokens_total"), "no event was made")
				return nil
			},
		},
		{
			name: "local in the queue", role: RoleBoth, kind: "local",
			mutate: func(c *Config) { c.MaxRunning, c.DecodePerToken = 1, 5*time.Second },
			run: func(t *testing.T, s *testSim) []*inflight {
				first := send(t, s.url+"/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":9}`)
				eventually(t, func() bool { return s.metric(t, "vllm:num_requests_running") == 1 }, "the slot is taken")
				second := send(t, s.url+"/v1/completions", smallCompletion)
				eventually(t, func() bool { return s.metric(t, "vllm:num_requests_waiting") == 1 }, "queued")
				second.leave()
				eventually(t, func() bool { return s.metric(t, "vllm:num_requests_waiting") == 0 }, "left the queue")
				return []*inflight{first}
			},
		},
		{
			name: "local stream mid decode", role: RoleBoth, kind: "local",
			mutate: func(c *Config) { c.DecodePerToken = 5 * time.Second },
			run: func(t *testing.T, s *testSim) []*inflight {
				f := send(t, s.url+"/v1/completions", stream(smallCompletion))
				eventually(t, func() bool { return s.metric(t, "vllm:generation_tokens_total") == 1 }, "first token out")
				f.leave()
				return nil
			},
		},
		{
			name: "decode leg mid KV pull", role: RoleDecode, kind: "decode",
			run: func(t *testing.T, s *testSim) []*inflight {
				port := silentPrefiller(t)
				body := `{"model":"sim-model","prompt":"x","max_tokens":2,"kv_transfer_params":{"do_remote_prefill":true,` +
					`"remote_engine_id":"e","remote_request_id":"r","remote_block_ids":[[1]],"remote_host":"127.0.0.1","remote_port":` +
					mustJSON(port) + `,"tp_size":1,"dcp_size":1,"pp_size":1,"remote_blocks_expiry_time":null}}`
				f := send(t, s.url+"/v1/completions", body)
				eventually(t, func() bool { return s.metric(t, "vllm:num_requests_running") == 1 }, "pulling")
				f.leave()
				assert.Zero(t, s.metric(t, "sim_kv_load_failures_total"), "a cancelled pull is not a failed load")
				return nil
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startSim(t, tc.role, tc.mutate)
			if tc.faults != "" {
				setFaults(t, s, tc.faults)
			}
			rest := tc.run(t, s)
			eventually(t, func() bool { return s.metric(t, "sim_requests_cancelled_total") == 1 }, "counted")
			eventually(t, func() bool { return s.metric(t, "vllm:num_requests_running") == float64(len(rest)) }, "stopped")
			assert.Equal(t, 1.0, s.kindMetric(t, "sim_requests_cancelled_total", tc.kind))
			assert.Zero(t, s.metric(t, "sim_kv_blocks_held"), "nothing held")
			assert.Zero(t, s.metric(t, "vllm:num_requests_waiting"))
			assert.Equal(t, tc.prefills, s.metric(t, "sim_remote_decode_prefills_total"))
			assert.Zero(t, s.metric(t, "sim_kv_released_on_cancel_total"), "no hold was made to release")
			assert.Zero(t, s.metric(t, "vllm:request_success_total"))
			for _, f := range rest {
				f.leave()
			}
			eventually(t, func() bool { return s.metric(t, "sim_requests_cancelled_total") == float64(1+len(rest)) }, "each once")
		})
	}
}

// TestAnsweredPrefillKeepsItsHold: a client that leaves after its prefill
// answer (with kv_transfer_params) was written did not cancel it, and the KV
// stays held for the decoder it was told about.
func TestAnsweredPrefillKeepsItsHold(t *testing.T) {
	s := startSim(t, RolePrefill, nil)
	a := post(t, s.url+"/v1/completions", prefillCompletion)
	require.Equal(t, 200, a.status, "%s", a.body)
	require.NotNil(t, get(a.json, "kv_transfer_params", "remote_block_ids"))
	assert.Equal(t, 1.0, s.metric(t, "sim_kv_blocks_held"))
	assert.Equal(t, 1.0, s.metric(t, "sim_remote_decode_prefills_total"))
	assert.Zero(t, s.metric(t, "sim_requests_cancelled_total"))
	_, _, err := stream(t, s.url+"/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":3,"stream":true}`)
	require.NoError(t, err)
	assert.Zero(t, s.metric(t, "sim_requests_cancelled_total"), "a stream read to its end is not cancelled")
}

// TestCancelledP2PPrefillFreesItsHold: a P2P prefill holds its KV before its
// answer; a client that leaves before the answer frees it at once.
func TestCancelledP2PPrefillFreesItsHold(t *testing.T) {
	s := startSim(t, RolePrefill, func(c *Config) { c.DecodePerToken = 5 * time.Second })
	f := send(t, s.url+"/v1/completions",
		`{"model":"sim-model","prompt":"p2p cancel","max_tokens":4,"kv_transfer_params":{"remote_decoder":{"kv_request_id":"k1"}}}`)
	eventually(t, func() bool { return s.metric(t, "sim_kv_blocks_held") == 1 }, "held before the answer")
	f.leave()
	eventually(t, func() bool { return s.metric(t, "sim_kv_blocks_held") == 0 }, "freed")
	assert.Equal(t, 1.0, s.metric(t, "sim_kv_released_on_cancel_total"))
	assert.Equal(t, 1.0, s.kindMetric(t, "sim_requests_cancelled_total", "prefill"))
}
