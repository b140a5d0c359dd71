package e2e

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// dpRig is a sidecar with two data-parallel ranks in front of two decode
// engines, and a prefill engine.
type dpRig struct {
	sc          *harness.Sidecar
	e0, e1, pre *harness.Engine
}

func newDPRig(t *testing.T) *dpRig {
	t.Helper()
	base := harness.FreePorts(t, 2)
	// Streams last long enough (100 tokens, 200 ms) to move to an event loop.
	e0 := startEngineOn(t, base, "--decode-us-per-token", "2000")
	e1 := startEngineOn(t, base+1, "--decode-us-per-token", "2000")
	return &dpRig{
		sc: harness.StartSidecar(t, base, "--data-parallel-size", "2"),
		e0: e0, e1: e1, pre: harness.StartEngineSim(t, "prefill"),
	}
}

// counts is how many inference requests each engine has received.
func (g *dpRig) counts(t *testing.T) [3]int {
	return [3]int{len(simRequests(t, g.e0)), len(simRequests(t, g.e1)), len(simRequests(t, g.pre))}
}

// lastCarries reports whether e's last inference request carried the
// data-parallel header.
func lastCarries(t *testing.T, e *harness.Engine) bool {
	t.Helper()
	reqs := simRequests(t, e)
	require.NotEmpty(t, reqs)
	for k := range reqs[len(reqs)-1].Headers {
		if strings.EqualFold(k, "x-data-parallel-host-port") {
			return true
		}
	}
	return false
}

// An inference request whose x-data-parallel-host-port names rank 1 is
// decoded by rank 1's engine though it arrived on rank 0's port, with and
// without a prefiller, on the lane (one write) and on fasthttp's path
// (the head in two writes); no leg carries the header.
func TestDataParallelHeaderPicksRank(t *testing.T) {
	g := newDPRig(t)
	rank1 := harness.HostPort(g.sc.Port + 1)
	for _, tc := range []struct {
		name    string
		split   bool
		whole   bool
		path    string
		body    string
		headers map[string]string
	}{
		{"decoder only, lane", false, true, "/v1/completions", completionBody(`,"max_tokens":3`), nil},
		{"decoder only, fasthttp", false, false, "/v1/chat/completions", chatBody(`,"max_tokens":3`), nil},
		{"split, lane", true, true, "/v1/completions", completionBody(`,"max_tokens":3`), nil},
		{"split, fasthttp", true, false, "/v1/completions", completionBody(`,"max_tokens":3,"stream":true`), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]string{"x-data-parallel-host-port": rank1}
			if tc.split {
				h["x-prefiller-host-port"] = g.pre.HostPort()
			}
			before := g.counts(t)
			kv0 := g.e0.Metric(t, "sim_remote_kv_decodes_total", nil)
			kv1 := g.e1.Metric(t, "sim_remote_kv_decodes_total", nil)
			onLoops := g.sc.Metric(t, "pd_sidecar_loop_requests_total", nil)
			resp, b := exchangeRaw(t, g.sc.Port, tc.path, tc.body, h, tc.whole)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			if tc.whole {
				assert.Equal(t, onLoops+1, g.sc.Metric(t, "pd_sidecar_loop_requests_total", nil), "served on the event loops")
			}
			after := g.counts(t)
			assert.Equal(t, before[0], after[0], "rank 0's engine saw nothing")
			assert.Equal(t, before[1]+1, after[1], "rank 1's engine decoded it")
			assert.False(t, lastCarries(t, g.e1), "the decode leg does not carry the header")
			if !tc.split {
				assert.Equal(t, before[2], after[2])
				return
			}
			assert.Equal(t, before[2]+1, after[2], "prefilled remotely")
			assert.False(t, lastCarries(t, g.pre), "the prefill leg does not carry the header")
			assert.Equal(t, kv1+1, g.e1.Metric(t, "sim_remote_kv_decodes_total", nil), "rank 1 decoded on the remote KV")
			assert.Equal(t, kv0, g.e0.Metric(t, "sim_remote_kv_decodes_total", nil))
		})
	}
}

// The connection a routed request came on stays rank 0's: after a stream
// decoded by rank 1 (long enough to move to an event loop), the next
// request without the header on the same connection goes to rank 0. The
// lane serves the routed split whose head came whole (nixlv2's sequential
// split and sglang's paired one alike) and takes the connection back after
// the other.
func TestDataParallelHeaderKeepsConnectionRank(t *testing.T) {
	for _, connector := range []string{"nixlv2", "sglang"} {
		t.Run(connector, func(t *testing.T) {
			base := harness.FreePorts(t, 2)
			g := &dpRig{pre: harness.StartEngineSim(t, "prefill")}
			// 100 tokens take 200 ms: the stream moves to an event loop.
			g.e0 = startEngineOn(t, base, "--decode-us-per-token", "2000")
			g.e1 = startEngineOn(t, base+1, "--decode-us-per-token", "2000")
			g.sc = harness.StartSidecar(t, base, "--data-parallel-size", "2", "--kv-connector", connector,
				"--sglang-bootstrap-port", itoa(g.pre.BootstrapPort))
			for _, whole := range []bool{true, false} {
				conn, err := net.Dial("tcp", harness.HostPort(g.sc.Port))
				require.NoError(t, err)
				t.Cleanup(func() { conn.Close() })
				br := bufio.NewReader(conn)
				before := g.counts(t)
				resp, b := exchangeOn(t, conn, br, "/v1/completions", completionBody(`,"max_tokens":100,"stream":true`),
					map[string]string{"x-data-parallel-host-port": harness.HostPort(g.sc.Port + 1), "x-prefiller-host-port": g.pre.HostPort()}, whole)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
				require.Contains(t, string(b), "[DONE]")
				resp, b = exchangeOn(t, conn, br, "/v1/completions", completionBody(`,"max_tokens":3`), nil, whole)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
				assert.Equal(t, [3]int{before[0] + 1, before[1] + 1, before[2] + 1}, g.counts(t), "whole=%v: rank 1, then rank 0", whole)
			}
			// The whole head's stream is the lane's from its first byte; the
			// other is fasthttp's, moved to an event loop.
			assert.Equal(t, 1.0, g.sc.Metric(t, "pd_sidecar_loop_handoffs_total", nil), "the streams moved to an event loop")
		})
	}
}

// A value that names no rank of this pod is a 400 JSON error, counted and
// sent to no engine, on either path and with or without a prefiller.
func TestDataParallelHeaderUnknownRank(t *testing.T) {
	g := newDPRig(t)
	values := []string{
		harness.HostPort(g.sc.Port + 2), // past the last rank
		harness.HostPort(g.sc.Port - 1),
		"10.0.0.1:" + itoa(g.sc.Port+1), // another pod
		"rank-one",                      // not host:port
	}
	n := 0
	for _, v := range values {
		for _, split := range []bool{false, true} {
			for _, whole := range []bool{true, false} {
				h := map[string]string{"x-data-parallel-host-port": v}
				if split {
					h["x-prefiller-host-port"] = g.pre.HostPort()
				}
				before := g.counts(t)
				resp, b := exchangeRaw(t, g.sc.Port, "/v1/completions", completionBody(`,"max_tokens":3`), h, whole)
				n++
				require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
				assert.Contains(t, resp.Header.Get("Content-Type"), "application/json")
				assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "x-data-parallel-host-port", "%s", b)
				assert.Equal(t, int64(400), gjson.GetBytes(b, "error.code").Int())
				assert.Equal(t, before, g.counts(t), "%q split=%v whole=%v reached an engine", v, split, whole)
			}
		}
	}
	assert.Equal(t, float64(n), g.sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": "unknown_data_parallel_rank"}))
	assert.Equal(t, float64(n), g.sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"code": "400"}))
}

// As in llm-d, only the inference routes honour the header: a passthrough
// request goes to the engine of the port it arrived on whatever it names
// (an unknown value too), and the header never reaches the engine.
func TestDataParallelHeaderPassthroughIgnored(t *testing.T) {
	g := newDPRig(t)
	for _, v := range []string{harness.HostPort(g.sc.Port + 1), "nowhere"} {
		req, err := http.NewRequest(http.MethodGet, g.sc.URL()+"/v1/models", nil)
		require.NoError(t, err)
		req.Header.Set("x-data-parallel-host-port", v)
		before0, before1 := len(journal(t, g.e0)), len(journal(t, g.e1))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		j0 := journal(t, g.e0)
		require.Len(t, j0, before0+1, "rank 0's engine answered %q", v)
		assert.Len(t, journal(t, g.e1), before1)
		for k := range j0[len(j0)-1].Headers {
			assert.False(t, strings.EqualFold(k, "x-data-parallel-host-port"), "the header reached the engine")
		}
	}
}

// With POD_IP set, the ranks are named by the pod's IP, no longer by
// loopback.
func TestDataParallelHeaderPodIP(t *testing.T) {
	base := harness.FreePorts(t, 2)
	e0, e1 := startEngineOn(t, base), startEngineOn(t, base+1)
	t.Setenv("POD_IP", "10.9.8.7") // the sidecar inherits it
	sc := harness.StartSidecar(t, base, "--data-parallel-size", "2")
	st, b, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":3`),
		map[string]string{"x-data-parallel-host-port": "10.9.8.7:" + itoa(sc.Port+1)})
	require.Equal(t, http.StatusOK, st, "%s", b)
	assert.Len(t, simRequests(t, e1), 1)
	st, b, _ = scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":3`),
		map[string]string{"x-data-parallel-host-port": harness.HostPort(sc.Port + 1)})
	require.Equal(t, http.StatusBadRequest, st, "%s", b)
	assert.Empty(t, simRequests(t, e0))
	assert.Len(t, simRequests(t, e1), 1)
}
