package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// Streams run on the sidecar's event loops: a request the lane takes
// (proxy/lane: local or P/D, its head whole in one read) from its first byte,
// any other once it has streamed 50 ms on its fasthttp goroutine
// (relay.LoopStream; these tests send such a request with its head in two writes:
// postSplit). These tests run streams long enough to be seen there and check,
// on the loop_requests, loop_handoffs and loop_streams metrics, that they
// were; then that nothing about the answer changed.

// slowRig is a P/D rig whose decode engine takes perToken per token.
func slowRig(t *testing.T, perToken string, flags ...string) *pdRig {
	t.Helper()
	r := &pdRig{
		prefill: harness.StartEngineSim(t, "prefill"),
		decode:  harness.StartEngineSim(t, "decode", "--decode-us-per-token", perToken),
	}
	r.sc = harness.StartSidecar(t, r.decode.Port, flags...)
	return r
}

// readEvents reads SSE data payloads from br to the end of the stream.
func readEvents(t *testing.T, br *bufio.Reader) (text string, events []string) {
	t.Helper()
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			events = append(events, data)
			b.WriteString(gjson.Get(data, "choices.0.text").String())
			b.WriteString(gjson.Get(data, "choices.0.delta.content").String())
		}
		if err == io.EOF {
			return b.String(), events
		}
		require.NoError(t, err)
	}
}

// streamOnLoop posts a streaming request with client c, waits until it
// streams on a loop (served by the lane, or handed over when sent in two
// writes: handOver, on a connection of its own), and reads it to its end.
func streamOnLoop(t *testing.T, c *http.Client, rig *pdRig, path, body string, hdr map[string]string, handOver bool) (string, []string, bool) {
	t.Helper()
	counter := "pd_sidecar_loop_requests_total" // counted at the end
	if handOver {
		counter = "pd_sidecar_loop_handoffs_total" // counted at the hand-over
	}
	before := rig.scMetric(t, counter, nil)
	reused := false
	var resp *http.Response
	if handOver {
		resp, _ = postSplit(t, rig.sc.Port, path, body, hdr)
	} else {
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
			http.MethodPost, rig.sc.URL()+path, strings.NewReader(body))
		require.NoError(t, err)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err = c.Do(req)
		require.NoError(t, err)
	}
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	harness.Eventually(t, 30*time.Second, "the stream is on a loop", func() bool {
		return rig.scMetric(t, "pd_sidecar_loop_streams", nil) == 1 &&
			(counter == "pd_sidecar_loop_requests_total" || rig.scMetric(t, counter, nil) == before+1)
	})
	text, events := readEvents(t, bufio.NewReader(resp.Body))
	harness.Eventually(t, 30*time.Second, "the loop lets go of the stream", func() bool {
		return rig.scMetric(t, "pd_sidecar_loop_streams", nil) == 0 && rig.scMetric(t, counter, nil) == before+1
	})
	return text, events, reused
}

// TestLoopStreamDisaggregatedChat: a P/D stream the lane serves and one
// handed over answer the tokens of a local prefill, decoded on the
// prefiller's KV, with the cached_tokens rewrite, on one connection.
func TestLoopStreamDisaggregatedChat(t *testing.T) {
	for _, handOver := range []bool{false, true} {
		t.Run(map[bool]string{false: "lane", true: "handed over"}[handOver], func(t *testing.T) {
			rig := slowRig(t, "100000") // 25 tokens: 2.5 s, time to see the stream on a loop
			c := &http.Client{Transport: &http.Transport{}}
			body := chatBody(`,"max_tokens":25,"stream":true,"stream_options":{"include_usage":true}`)
			local, _, _ := streamOnLoop(t, c, rig, "/v1/chat/completions", body, nil, false)
			require.NotEmpty(t, local)
			got, events, reused := streamOnLoop(t, c, rig, "/v1/chat/completions", body, rig.header(), handOver)
			assert.Equal(t, !handOver, reused, "the lane's stream reused the connection the loop gave back")
			assert.Equal(t, local, got, "the same tokens as a local prefill")
			assert.Equal(t, 1.0, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil), "decoded on the prefiller's KV")
			assert.Equal(t, 1.0, rig.prefill.Metric(t, "sim_remote_decode_prefills_total", nil), "prefilled on the prefiller")
			require.GreaterOrEqual(t, len(events), 3)
			assert.Equal(t, "[DONE]", events[len(events)-1])
			assert.Equal(t, 25, strings.Count(strings.Join(events, "\n"), `"content":" `), "every token")
			usage := gjson.Get(events[len(events)-2], "usage")
			require.True(t, usage.Exists(), "usage chunk: %v", events[len(events)-2])
			assert.Equal(t, int64(0), usage.Get("prompt_tokens_details.cached_tokens").Int(),
				"the loop applies the cached_tokens rewrite (the decoder reports the whole prompt cached)")
			lane := 2.0
			if handOver {
				lane = 1
			}
			assert.Equal(t, lane, rig.scMetric(t, laneRequests, nil), "the lane's streams")
			// The connection went back to the server: a plain request on it works.
			st, b, _ := scPost(t, rig.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":2`), nil)
			assert.Equal(t, http.StatusOK, st, "%s", b)
		})
	}
}

// TestLoopStreamClientLeaves: a client leaving a stream on a loop (a
// local one the lane serves, a P/D one handed over) is counted, and the
// engine stops generating for it.
func TestLoopStreamClientLeaves(t *testing.T) {
	for _, tc := range []struct {
		name         string
		pd, handOver bool
	}{{"local", false, false}, {"pd", true, false}, {"pd handed over", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			rig := slowRig(t, "20000") // 2,000 tokens: 40 s, far past the client's leaving
			hdr := map[string]string(nil)
			if tc.pd {
				hdr = rig.header()
			}
			body := completionBody(`,"max_tokens":2000,"stream":true`)
			var cancel func()
			if tc.handOver {
				resp, conn := postSplit(t, rig.sc.Port, "/v1/completions", body, hdr)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				_, err := bufio.NewReader(resp.Body).ReadString('\n')
				require.NoError(t, err)
				cancel = func() { conn.Close() }
			} else {
				_, cancel = openStream(t, rig.sc.URL()+"/v1/completions", body, hdr, 1)
			}
			harness.Eventually(t, 30*time.Second, "the stream is on a loop", func() bool {
				return rig.scMetric(t, "pd_sidecar_loop_streams", nil) == 1
			})
			cancel()
			harness.Eventually(t, 30*time.Second, "the decode engine stops", func() bool { return running(t, rig.decode) == 0 })
			assert.Less(t, rig.decode.Metric(t, "vllm:generation_tokens_total", nil), 1000.0, "decode was cut short")
			harness.Eventually(t, 30*time.Second, "disconnect counted, loop idle", func() bool {
				return rig.scMetric(t, "pd_sidecar_client_disconnects_total", nil) == 1 &&
					rig.scMetric(t, "pd_sidecar_loop_streams", nil) == 0
			})
			lane := 1.0
			if tc.handOver {
				lane = 0
			}
			assert.Equal(t, lane, rig.scMetric(t, laneRequests, nil))
		})
	}
}

func TestLoopStreamBrokenUpstreamEndsWithError(t *testing.T) {
	for _, handOver := range []bool{false, true} {
		t.Run(map[bool]string{false: "lane", true: "handed over"}[handOver], func(t *testing.T) {
			rig := slowRig(t, "200000") // 12 chunks: 2.4 s, time to see the stream on a loop
			setFault(t, rig.decode, `{"die_after_chunks":12,"only":"decode"}`)
			c := &http.Client{Transport: &http.Transport{}}
			_, events, _ := streamOnLoop(t, c, rig, "/v1/chat/completions", chatBody(`,"max_tokens":40,"stream":true`), rig.header(), handOver)
			require.GreaterOrEqual(t, len(events), 2)
			assert.Equal(t, "[DONE]", events[len(events)-1])
			assert.True(t, gjson.Get(events[len(events)-2], "error").Exists(), "ends with an error event: %v", events[len(events)-2])
		})
	}
}

// TestLoopStreamSlowReader has a client stop reading while its stream is on
// a loop, and loses nothing. (Whether the loop had to hold bytes back
// depends on the kernel's socket buffers; proxy's
// TestLoopStreamBackpressure makes sure it does.)
func TestLoopStreamSlowReader(t *testing.T) {
	rig := slowRig(t, "100")
	conn, err := net.Dial("tcp", harness.HostPort(rig.sc.Port))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(32<<10))
	body := completionBody(`,"max_tokens":1500,"stream":true`)
	_, err = fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	br := bufio.NewReaderSize(conn, 1<<10)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	harness.Eventually(t, 30*time.Second, "the stream moves to a loop", func() bool {
		return rig.scMetric(t, "pd_sidecar_loop_streams", nil) == 1
	})
	time.Sleep(700 * time.Millisecond) // not reading
	_, events := readEvents(t, bufio.NewReader(resp.Body))
	assert.Equal(t, 1500, strings.Count(strings.Join(events, "\n"), `"text"`), "every token, in spite of the pause")
	assert.Equal(t, "[DONE]", events[len(events)-1])
}

// TestLoopStreamPipelinedStaysOnGoroutine pipelines a second request behind
// a long stream: fasthttp has read it ahead, so the stream must not move
// (the request would be lost); both are answered.
func TestLoopStreamPipelinedStaysOnGoroutine(t *testing.T) {
	rig := slowRig(t, "100000") // 15 tokens: 1.5 s, time to see the control's stream on a loop
	conn, err := net.Dial("tcp", harness.HostPort(rig.sc.Port))
	require.NoError(t, err)
	defer conn.Close()
	stream := completionBody(`,"max_tokens":15,"stream":true`)
	plain := completionBody(`,"max_tokens":2`)
	req := func(b string) string {
		return fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
	}
	_, err = io.WriteString(conn, req(stream)+req(plain))
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, events := readEvents(t, bufio.NewReader(resp.Body))
	resp.Body.Close()
	assert.Equal(t, 15, strings.Count(strings.Join(events, "\n"), `"text"`))
	resp2, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "the pipelined request is answered")
	b, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	assert.Equal(t, http.StatusOK, resp2.StatusCode, "%s", b)
	assert.Zero(t, rig.scMetric(t, "pd_sidecar_loop_handoffs_total", nil), "the stream stayed on its goroutine")
	assert.Zero(t, rig.scMetric(t, "pd_sidecar_loop_requests_total", nil), "fasthttp served both (not read whole alone)")

	// Control: the same stream alone moves.
	c := &http.Client{Transport: &http.Transport{}}
	streamOnLoop(t, c, rig, "/v1/completions", stream, nil, false)
}

func TestLoopStreamGracefulShutdownDrains(t *testing.T) {
	rig := slowRig(t, "10000") // 300 tokens: 3 s, time to see the stream on a loop and signal
	br, _ := openStream(t, rig.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":300,"stream":true`), rig.header(), 1)
	harness.Eventually(t, 30*time.Second, "the stream moves to a loop", func() bool {
		return rig.scMetric(t, "pd_sidecar_loop_streams", nil) == 1
	})
	require.NoError(t, rig.sc.Signal(syscall.SIGTERM))
	_, events := readEvents(t, br)
	assert.Equal(t, 300-1, strings.Count(strings.Join(events, "\n"), `"text"`), "every token arrived")
	assert.Equal(t, "[DONE]", events[len(events)-1])
	code, err := rig.sc.Wait(30 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
}
