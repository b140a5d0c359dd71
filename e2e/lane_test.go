package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// The lane (proxy/lane) serves local inference requests on the event
// loops from their first byte, and gives every other request to fasthttp
// and takes the connection back after. These tests count its requests on
// pd_sidecar_loop_requests_total, which only the lane moves.

const laneRequests = "pd_sidecar_loop_requests_total"

// TestLaneConnectionMovesBetweenLaneAndServer: one keep-alive connection
// carries local and P/D requests (the lane's) and a GET (fasthttp's) in
// turn; every answer is right, the P/D ones decoded on remote KV, every
// inference request was the lane's, and the client never needed a second
// connection.
func TestLaneConnectionMovesBetweenLaneAndServer(t *testing.T) {
	rig := newRig(t)
	conns := 0
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if !i.Reused {
			conns++
		}
	}}
	c := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	do := func(method, path, body string, hdr map[string]string) (int, []byte) {
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
			method, rig.sc.URL()+path, strings.NewReader(body))
		require.NoError(t, err)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		if method == http.MethodPost {
			assert.NotEmpty(t, resp.Header.Get("X-Request-Id"), "every inference answer carries the request id")
		}
		return resp.StatusCode, b
	}
	body := completionBody(`,"max_tokens":6`)
	stream := completionBody(`,"max_tokens":6,"stream":true`)
	var texts []string
	for i, step := range []struct {
		method, body string
		pd           bool
	}{
		{"POST", body, false}, {"POST", body, true}, {"GET", "", false}, {"POST", stream, false},
		{"POST", stream, true}, {"POST", body, false}, {"POST", body, false},
	} {
		path, hdr := "/v1/completions", map[string]string(nil)
		if step.method == "GET" {
			path = "/v1/models"
		}
		if step.pd {
			hdr = rig.header()
		}
		st, b := do(step.method, path, step.body, hdr)
		require.Equal(t, http.StatusOK, st, "step %d: %s", i, b)
		if step.method == "POST" && step.body == body {
			texts = append(texts, textOf(b))
		}
	}
	assert.Equal(t, 1, conns, "one connection for all of it")
	require.Len(t, texts, 4)
	assert.Equal(t, texts[0], texts[1], "P/D answers the same tokens as local")
	assert.Equal(t, texts[0], texts[2])
	assert.Equal(t, texts[0], texts[3])
	assert.Equal(t, 6.0, rig.scMetric(t, laneRequests, nil), "every inference request was the lane's, the P/D ones too")
	assert.Equal(t, 2.0, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil), "the two P/D ones decoded on remote KV")
	assert.Equal(t, 6.0, rig.scMetric(t, "pd_sidecar_requests_total", nil), "every inference request counted once")
}

// TestLaneRetriesAStalePooledConnection: the engine resets the pooled
// connection the lane sends a request on (as an engine that closed an idle
// keep-alive connection does); the lane sends it once more on a fresh one
// and the client never knows. When the fresh one fails too, the client
// gets a JSON error, not a hang and not a third try.
func TestLaneRetriesAStalePooledConnection(t *testing.T) {
	rig := newRig(t)
	body := completionBody(`,"max_tokens":4,"stream":true`)
	st, _, _ := scStream(t, rig.sc.URL()+"/v1/completions", body, nil) // pools a connection
	require.Equal(t, http.StatusOK, st)

	setFault(t, rig.decode, `{"refuse":true,"times":1}`)
	st, text, events := scStream(t, rig.sc.URL()+"/v1/completions", body, nil)
	require.Equal(t, http.StatusOK, st)
	assert.NotEmpty(t, text)
	assert.Equal(t, "[DONE]", events[len(events)-1])
	assert.Equal(t, 1.0, rig.decode.Metric(t, "sim_faults_injected_total", map[string]string{"kind": "refuse"}), "the pooled connection was reset")

	setFault(t, rig.decode, `{"refuse":true,"times":2}`)
	st, b, hdr := scPost(t, rig.sc.URL()+"/v1/completions", body, nil)
	assert.Equal(t, http.StatusBadGateway, st, "%s", b)
	assert.Equal(t, int64(502), gjson.GetBytes(b, "error.code").Int(), "%s", b)
	assert.NotEmpty(t, hdr.Get("X-Request-Id"))
	assert.Equal(t, 3.0, rig.decode.Metric(t, "sim_faults_injected_total", map[string]string{"kind": "refuse"}), "one retry, no more")
	assert.Equal(t, 3.0, rig.scMetric(t, laneRequests, nil), "all three on the lane")
	assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"code": "502"}))
}

// TestLaneClientLeavesBeforeTheAnswer: a client that hangs up while its
// request waits for the engine's answer (a JSON answer, or a stream whose
// head came and is held back until its first event) is counted, and the
// engine sees the request abandoned (its connection closed), as on the
// fasthttp path.
func TestLaneClientLeavesBeforeTheAnswer(t *testing.T) {
	rig := &pdRig{decode: harness.StartEngineSim(t, "decode", "--prefill-us-per-token", "5000000")} // minutes of prefill: outlasts any machine's steps below
	rig.sc = harness.StartSidecar(t, rig.decode.Port)
	for i, body := range []string{completionBody(`,"max_tokens":4`), completionBody(`,"max_tokens":4,"stream":true`)} {
		conn, err := net.Dial("tcp", harness.HostPort(rig.sc.Port))
		require.NoError(t, err)
		_, err = fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		require.NoError(t, err)
		harness.Eventually(t, 30*time.Second, "the engine holds the request", func() bool { return running(t, rig.decode) == 1 })
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
		_, err = conn.Read(make([]byte, 1))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "nothing of the answer yet")
		require.NoError(t, conn.Close())
		harness.Eventually(t, 30*time.Second, "the engine saw it abandoned", func() bool { return running(t, rig.decode) == 0 })
		assert.Zero(t, rig.decode.Metric(t, "vllm:request_success_total", nil), "and did not finish it")
		n := float64(i + 1)
		harness.Eventually(t, 30*time.Second, "counted", func() bool {
			return rig.scMetric(t, "pd_sidecar_client_disconnects_total", map[string]string{"phase": "local"}) == n &&
				rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"code": "499"}) == n
		})
		assert.Equal(t, n, rig.scMetric(t, laneRequests, nil))
	}
}

// TestLaneIdleTimeoutAndPipelining: requests pipelined in one write, and
// a request whose head comes in two writes, are fasthttp's and
// answered in order, and the connection then comes back to the lane; a
// connection idle past --idle-timeout on the lane is closed.
func TestLaneIdleTimeoutAndPipelining(t *testing.T) {
	rig := newRig(t, "--idle-timeout", "400ms")
	conn, err := net.Dial("tcp", harness.HostPort(rig.sc.Port))
	require.NoError(t, err)
	defer conn.Close()
	br := bufio.NewReader(conn)
	req := func(maxTokens int) string {
		b := completionBody(fmt.Sprintf(`,"max_tokens":%d`, maxTokens))
		return fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
	}
	_, err = io.WriteString(conn, req(2))
	require.NoError(t, err)
	readOK(t, br)
	assert.Equal(t, 1.0, rig.scMetric(t, laneRequests, nil))

	// Three requests in one write: the lane hands them to fasthttp, which
	// answers each in order.
	_, err = io.WriteString(conn, req(1)+req(2)+req(3))
	require.NoError(t, err)
	for want := 1; want <= 3; want++ {
		assert.Equal(t, int64(want), gjson.GetBytes(readOK(t, br), "usage.completion_tokens").Int(), "answer %d in order", want)
	}

	// A request whose head comes in two writes is fasthttp's; the
	// connection comes back to the lane after it.
	split := req(2)
	cut := strings.Index(split, "\r\n") + 2 // the request line alone
	_, err = io.WriteString(conn, split[:cut])
	require.NoError(t, err)
	harness.WaitPeerRead(t, conn, 30*time.Second) // the loop read the request line alone
	_, err = io.WriteString(conn, split[cut:]+req(3))
	require.NoError(t, err)
	for want := 2; want <= 3; want++ {
		assert.Equal(t, int64(want), gjson.GetBytes(readOK(t, br), "usage.completion_tokens").Int(), "answer %d in order", want)
	}
	_, err = io.WriteString(conn, req(1))
	require.NoError(t, err)
	readOK(t, br)
	assert.Equal(t, 2.0, rig.scMetric(t, laneRequests, nil), "the connection came back to the lane")

	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the sidecar closed the idle connection")
	// Closed by the 400 ms idle timeout, not left open: generous headroom
	// for a loaded machine, far below the read deadline.
	assert.Less(t, time.Since(start), 400*time.Millisecond+10*time.Second)
}

// TestLaneLongAnswersAndBrokenStream: answers longer than one read of the
// loop (a 3,000-token stream and its JSON twin) arrive whole and equal to
// the engine's own; a stream the engine cuts ends with an error event, not
// silently.
func TestLaneLongAnswersAndBrokenStream(t *testing.T) {
	rig := &pdRig{decode: harness.StartEngineSim(t, "decode", "--decode-us-per-token", "0")}
	rig.sc = harness.StartSidecar(t, rig.decode.Port)
	for _, stream := range []bool{false, true} {
		body := completionBody(fmt.Sprintf(`,"max_tokens":6000,"stream":%t`, stream))
		var direct, viaLane string
		if stream {
			var events []string
			_, direct, _ = scStream(t, rig.decode.URL()+"/v1/completions", body, nil)
			_, viaLane, events = scStream(t, rig.sc.URL()+"/v1/completions", body, nil)
			assert.Equal(t, "[DONE]", events[len(events)-1])
		} else {
			_, b, _ := scPost(t, rig.decode.URL()+"/v1/completions", body, nil)
			direct = textOf(b)
			st, b, _ := scPost(t, rig.sc.URL()+"/v1/completions", body, nil)
			require.Equal(t, http.StatusOK, st)
			viaLane = textOf(b)
		}
		require.Greater(t, len(direct), 16<<10, "longer than one read of the loop")
		assert.Equal(t, direct, viaLane, "stream %t", stream)
	}

	setFault(t, rig.decode, `{"die_after_chunks":5}`)
	st, _, events := scStream(t, rig.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":40,"stream":true`), nil)
	require.Equal(t, http.StatusOK, st)
	require.NotEmpty(t, events)
	require.GreaterOrEqual(t, len(events), 2)
	assert.Equal(t, int64(502), gjson.Get(events[len(events)-2], "error.code").Int(), "ends with an error event: %v", events[len(events)-2:])
	harness.Eventually(t, 30*time.Second, "all on the lane", func() bool { return rig.scMetric(t, laneRequests, nil) == 3 })
}

// readOK reads one answer from br, requires it to be a 200, and returns
// its body.
func readOK(t *testing.T, br *bufio.Reader) []byte {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	return b
}

// TestLaneAnswersMadeOffTheLoopAreWhole: answers the lane makes after an
// event off its loop (a dial that failed, here: a refused prefiller with
// fallback off, a new address each time so that no circuit opens) are written while the loop serves other connections
// (local requests, here); every answer arrives whole and right. (Those
// answers once used the loop's shared buffers from the dialling goroutine,
// and a few in 100,000 came out garbled.)
func TestLaneAnswersMadeOffTheLoopAreWhole(t *testing.T) {
	rig := newRig(t, "--stream-loops", "1", "--prefill-fallback=false", "--log-level", "error")
	body := completionBody(`,"max_tokens":1`)
	const workers, each = 8, 300
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			c := &http.Client{Transport: &http.Transport{}}
			defer c.CloseIdleConnections()
			for i := range each {
				hdr, want := map[string]string(nil), http.StatusOK
				if w%2 == 0 { // 127.2.w.i:1, refused at once
					hdr, want = map[string]string{"x-prefiller-host-port": fmt.Sprintf("127.2.%d.%d:1", w, i%250+1)}, http.StatusBadGateway
				}
				req, err := http.NewRequest(http.MethodPost, rig.sc.URL()+"/v1/completions", strings.NewReader(body))
				if !assert.NoError(t, err) {
					return
				}
				for k, v := range hdr {
					req.Header.Set(k, v)
				}
				resp, err := c.Do(req)
				if !assert.NoError(t, err, "an answer that does not parse") {
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !assert.NoError(t, err) || !assert.Equal(t, want, resp.StatusCode, "%s", b) {
					return
				}
				assert.True(t, gjson.ValidBytes(b), "a whole JSON answer: %q", b)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, float64(workers*each), rig.scMetric(t, laneRequests, nil), "every request was the lane's")
}
