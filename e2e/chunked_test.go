package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/status"
)

// Chunked decode (--decode-chunk-size) between real processes: a sidecar
// in front of a decode engine-sim, a prefill engine-sim and a reference
// engine that answers every request in one go. engine-sim continues a
// final assistant message token for token (continue_final_message), so the
// stitched answer must equal the reference's; its journal and its
// sim_continued_messages_total show the chunks happened.

const chunkSize = 4

// chunkRig is a pdRig plus a reference engine.
type chunkRig struct {
	*pdRig
	ref *harness.Engine
}

func newChunkRig(t *testing.T, flags ...string) *chunkRig {
	t.Helper()
	return &chunkRig{pdRig: newRig(t, append([]string{"--decode-chunk-size", itoa(chunkSize)}, flags...)...),
		ref: harness.StartEngineSim(t, "both")}
}

func chunkChatBody(extra string) string {
	return `{"model":"sim-model","messages":[{"role":"system","content":"be brief"},{"role":"user","content":` +
		quote(simPrompt) + `}]` + extra + `}`
}

// forChunkDrivers runs test on a rig of its own for each serving path:
// the event loops' lane, and fasthttp's goroutines (--stream-loops=0);
// pd_sidecar_loop_requests_total proves which served the requests.
func forChunkDrivers(t *testing.T, test func(t *testing.T, r *chunkRig)) {
	t.Helper()
	for _, d := range []struct {
		name  string
		flags []string
		loops bool
	}{{"lane", nil, true}, {"fasthttp", []string{"--stream-loops=0"}, false}} {
		t.Run(d.name, func(t *testing.T) {
			r := newChunkRig(t, d.flags...)
			test(t, r)
			served := r.scMetric(t, "pd_sidecar_loop_requests_total", nil)
			if d.loops {
				assert.Equal(t, r.scMetric(t, "pd_sidecar_requests_total", nil), served, "every request served on the event loops")
			} else {
				assert.Zero(t, served, "served by fasthttp's goroutines")
			}
		})
	}
}

// want is the reference engine's one-shot answer to body (sent as JSON).
func (r *chunkRig) want(t *testing.T, body string) []byte {
	t.Helper()
	st, b, _ := scPost(t, r.ref.URL()+"/v1/chat/completions", body, nil)
	require.Equal(t, http.StatusOK, st, "%s", b)
	return b
}

// decodeChunks is the chat requests the decode engine received.
func (r *chunkRig) decodeChunks(t *testing.T) []gjson.Result {
	t.Helper()
	var out []gjson.Result
	for _, q := range simRequests(t, r.decode) {
		if q.Path == "/v1/chat/completions" {
			out = append(out, gjson.ParseBytes(q.Body))
		}
	}
	return out
}

// checkChunks asserts the decode engine got len(sizes) chunks asking for
// sizes tokens each, the later ones continuing the one assistant message.
func checkChunks(t *testing.T, chunks []gjson.Result, sizes ...int) {
	t.Helper()
	require.Len(t, chunks, len(sizes))
	for i, c := range chunks {
		assert.EqualValues(t, sizes[i], c.Get("max_tokens").Int(), "chunk %d", i+1)
		assert.EqualValues(t, sizes[i], c.Get("max_completion_tokens").Int(), "chunk %d", i+1)
		assert.Equal(t, "false", c.Get("stream").Raw, "chunk %d is not streamed", i+1)
		assert.False(t, c.Get("stream_options").Exists())
		msgs := c.Get("messages").Array()
		if i == 0 {
			assert.False(t, c.Get("continue_final_message").Exists())
			assert.Len(t, msgs, 2)
			continue
		}
		assert.True(t, c.Get("continue_final_message").Bool(), "chunk %d", i+1)
		assert.Equal(t, "false", c.Get("add_generation_prompt").Raw, "chunk %d", i+1)
		require.Len(t, msgs, 3, "chunk %d: one assistant message, extended", i+1)
		assert.Equal(t, "assistant", msgs[2].Get("role").String())
	}
}

func (r *chunkRig) chunkMetric(t *testing.T, outcome string) float64 {
	t.Helper()
	return r.scMetric(t, "pd_sidecar_chunked_decodes_total", map[string]string{"outcome": outcome})
}

// TestChunkedDecodeJSON: a decoder-only chat request of 10 tokens runs as
// chunks of 4, 4 and 2, and the stitched JSON answer is the reference's,
// text and usage; the status view counts the chunked decode.
func TestChunkedDecodeJSON(t *testing.T) {
	forChunkDrivers(t, func(t *testing.T, r *chunkRig) {
		body := chunkChatBody(`,"max_tokens":10`)
		want := r.want(t, body)
		st, got, _ := scPost(t, r.sc.URL()+"/v1/chat/completions", body, nil)
		require.Equal(t, http.StatusOK, st, "%s", got)
		assert.Equal(t, gjson.GetBytes(want, "choices.0.message.content").String(), gjson.GetBytes(got, "choices.0.message.content").String(), "token-exact")
		assert.Equal(t, "length", gjson.GetBytes(got, "choices.0.finish_reason").String())
		for _, k := range []string{"usage.prompt_tokens", "usage.completion_tokens", "usage.total_tokens"} {
			assert.Equal(t, gjson.GetBytes(want, k).Int(), gjson.GetBytes(got, k).Int(), k)
		}
		assert.Equal(t, "chat.completion", gjson.GetBytes(got, "object").String())

		checkChunks(t, r.decodeChunks(t), 4, 4, 2)
		assert.Equal(t, 2.0, r.decode.Metric(t, "sim_continued_messages_total", nil))
		assert.Equal(t, 3.0, r.scMetric(t, "pd_sidecar_decode_chunks_total", nil))
		assert.Equal(t, 1.0, r.chunkMetric(t, "completed"))
		assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "local", "code": "200"}))

		s, err := status.Fetch(context.Background(), nil, r.sc.URL())
		require.NoError(t, err)
		assert.Equal(t, 1, s.Window.ChunkedDecodes)
		assert.Equal(t, 3, s.Window.DecodeChunks)
	})
}

// TestChunkedDecodeSSE: streamed, the chunked decode is one
// chat.completion.chunk stream — the role in the first delta, each chunk's
// text as it comes, the finish_reason only at the end, the usage chunk only
// with include_usage — and its text is the reference's.
func TestChunkedDecodeSSE(t *testing.T) {
	forChunkDrivers(t, func(t *testing.T, r *chunkRig) {
		want := r.want(t, chunkChatBody(`,"max_tokens":10`))
		for _, usage := range []bool{false, true} {
			extra := `,"max_tokens":10,"stream":true`
			if usage {
				extra += `,"stream_options":{"include_usage":true}`
			}
			st, text, events := scStream(t, r.sc.URL()+"/v1/chat/completions", chunkChatBody(extra), nil)
			require.Equal(t, http.StatusOK, st)
			assert.Equal(t, gjson.GetBytes(want, "choices.0.message.content").String(), text, "token-exact")
			require.NotEmpty(t, events)
			assert.Equal(t, "[DONE]", events[len(events)-1])
			var finishes []string
			usageChunks := 0
			for i, e := range events[:len(events)-1] {
				assert.Equal(t, "chat.completion.chunk", gjson.Get(e, "object").String(), e)
				assert.Equal(t, i == 0, gjson.Get(e, "choices.0.delta.role").Exists(), "role in the first delta only: %s", e)
				if f := gjson.Get(e, "choices.0.finish_reason").String(); f != "" {
					finishes = append(finishes, f)
				}
				if u := gjson.Get(e, "usage"); u.IsObject() {
					usageChunks++
					assert.Equal(t, gjson.GetBytes(want, "usage.completion_tokens").Int(), u.Get("completion_tokens").Int())
					assert.Equal(t, gjson.GetBytes(want, "usage.prompt_tokens").Int(), u.Get("prompt_tokens").Int())
				}
			}
			assert.Equal(t, []string{"length"}, finishes, "one finish_reason, at the end")
			if usage {
				assert.Equal(t, 1, usageChunks)
			} else {
				assert.Zero(t, usageChunks)
			}
		}
		assert.Equal(t, 4.0, r.decode.Metric(t, "sim_continued_messages_total", nil))
		assert.Equal(t, 2.0, r.chunkMetric(t, "completed"))
	})
}

// TestChunkedDecodeNixlSplit: a nixlv2 split's decode leg is chunked: the
// prefiller prefilled for a remote decoder, the first chunk pulled the KV
// (the only one with kv_transfer_params), and the stitched text is the
// reference's.
func TestChunkedDecodeNixlSplit(t *testing.T) {
	forChunkDrivers(t, func(t *testing.T, r *chunkRig) {
		body := chunkChatBody(`,"max_completion_tokens":9`)
		want := r.want(t, body)
		st, got, _ := scPost(t, r.sc.URL()+"/v1/chat/completions", body, r.header())
		require.Equal(t, http.StatusOK, st, "%s", got)
		assert.Equal(t, gjson.GetBytes(want, "choices.0.message.content").String(), gjson.GetBytes(got, "choices.0.message.content").String(), "token-exact")
		assert.EqualValues(t, 9, gjson.GetBytes(got, "usage.completion_tokens").Int())

		assert.Equal(t, 1.0, r.prefill.Metric(t, "sim_remote_decode_prefills_total", nil), "prefilled for the decoder")
		assert.Equal(t, 1.0, r.decode.Metric(t, "sim_remote_kv_decodes_total", nil), "the first chunk decoded on the pulled KV")
		chunks := r.decodeChunks(t)
		checkChunks(t, chunks, 4, 4, 1)
		assert.True(t, chunks[0].Get("kv_transfer_params.do_remote_prefill").Bool(), "chunk 1 carries the handoff")
		for _, c := range chunks[1:] {
			assert.False(t, c.Get("kv_transfer_params").Exists(), "later chunks carry none")
		}
		assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
		assert.Equal(t, 1.0, r.chunkMetric(t, "completed"))
	})
}

// TestChunkedDecodeStopsOnFinish: a chunk that ends with "stop" ends the
// decode before the budget is spent, as the one-shot decode ends.
func TestChunkedDecodeStopsOnFinish(t *testing.T) {
	forChunkDrivers(t, func(t *testing.T, r *chunkRig) {
		for _, e := range []*harness.Engine{r.decode, r.ref} {
			setFault(t, e, `{"eos_after_tokens":6}`)
		}
		body := chunkChatBody(`,"max_tokens":20`)
		want := r.want(t, body)
		require.Equal(t, "stop", gjson.GetBytes(want, "choices.0.finish_reason").String())
		st, got, _ := scPost(t, r.sc.URL()+"/v1/chat/completions", body, nil)
		require.Equal(t, http.StatusOK, st, "%s", got)
		assert.Equal(t, "stop", gjson.GetBytes(got, "choices.0.finish_reason").String())
		assert.Equal(t, gjson.GetBytes(want, "choices.0.message.content").String(), gjson.GetBytes(got, "choices.0.message.content").String())
		assert.EqualValues(t, 7, gjson.GetBytes(got, "usage.completion_tokens").Int())
		checkChunks(t, r.decodeChunks(t), 4, 4)
	})
}

// TestChunkedDecodeBudgetFits: a budget of at most one chunk is one plain
// request, streamed natively; so is a request that is not chat.
func TestChunkedDecodeBudgetFits(t *testing.T) {
	forChunkDrivers(t, func(t *testing.T, r *chunkRig) {
		st, text, events := scStream(t, r.sc.URL()+"/v1/chat/completions", chunkChatBody(`,"max_tokens":4,"stream":true`), nil)
		require.Equal(t, http.StatusOK, st)
		assert.Len(t, strings.Fields(text), 4)
		assert.Equal(t, "[DONE]", events[len(events)-1])
		st, b, _ := scPost(t, r.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":10`), nil)
		require.Equal(t, http.StatusOK, st, "%s", b)
		reqs := simRequests(t, r.decode)
		require.Len(t, reqs, 2)
		assert.True(t, gjson.GetBytes(reqs[0].Body, "stream").Bool(), "passed through as sent")
		assert.EqualValues(t, 10, gjson.GetBytes(reqs[1].Body, "max_tokens").Int())
		assert.Zero(t, r.scMetric(t, "pd_sidecar_decode_chunks_total", nil))
		assert.Zero(t, r.decode.Metric(t, "sim_continued_messages_total", nil))
	})
}

// TestChunkedDecodeFailures: a chunk failing before the answer began is
// the client's error status; failing mid-stream, it ends the 200 stream
// with an error event and [DONE], and nothing else.
func TestChunkedDecodeFailures(t *testing.T) {
	forChunkDrivers(t, func(t *testing.T, r *chunkRig) {

		setFault(t, r.decode, `{"status":503,"times":1}`)
		st, b, _ := scPost(t, r.sc.URL()+"/v1/chat/completions", chunkChatBody(`,"max_tokens":10,"stream":true`), nil)
		assert.Equal(t, http.StatusServiceUnavailable, st, "%s", b)
		assert.True(t, gjson.GetBytes(b, "error.message").Exists(), "an OpenAI error: %s", b)

		setFault(t, r.decode, `{"status":500,"skip":1,"times":1}`)
		st, b, _ = scPost(t, r.sc.URL()+"/v1/chat/completions", chunkChatBody(`,"max_tokens":10`), nil)
		assert.Equal(t, http.StatusInternalServerError, st, "JSON: nothing sent yet when chunk 2 fails: %s", b)
		assert.True(t, gjson.GetBytes(b, "error.message").Exists(), "%s", b)

		setFault(t, r.decode, `{"status":500,"skip":1,"times":1}`)
		st, text, events := scStream(t, r.sc.URL()+"/v1/chat/completions", chunkChatBody(`,"max_tokens":10,"stream":true`), nil)
		require.Equal(t, http.StatusOK, st)
		assert.Len(t, strings.Fields(text), chunkSize, "the first chunk's text went out")
		require.Len(t, events, 3, "%q", events)
		assert.True(t, gjson.Get(events[1], "error").IsObject(), "an error event: %s", events[1])
		assert.Equal(t, "[DONE]", events[2])
		assert.False(t, gjson.Get(events[0], "choices.0.finish_reason").Exists() && gjson.Get(events[0], "choices.0.finish_reason").String() != "")
		assert.Equal(t, 3.0, r.chunkMetric(t, "failed"))
		assert.Zero(t, r.chunkMetric(t, "completed"))
	})
}

// TestChunkedDecodeClientLeaves: a client that leaves mid-stream cancels
// the chunk in flight: the engine stops, the decode is counted as left.
func TestChunkedDecodeClientLeaves(t *testing.T) {
	forChunkDrivers(t, func(t *testing.T, r *chunkRig) {
		setFault(t, r.decode, `{"latency_ms":60000,"skip":1}`) // chunk 2 runs until the client leaves
		_, cancel := openStream(t, r.sc.URL()+"/v1/chat/completions", chunkChatBody(`,"max_tokens":40,"stream":true`), nil, 1)
		harness.Eventually(t, 30*time.Second, "chunk 2 sent", func() bool { return len(r.decodeChunks(t)) == 2 })
		cancel()
		harness.Eventually(t, 30*time.Second, "decode counted as left", func() bool { return r.chunkMetric(t, "client_left") == 1 })
		assert.Len(t, r.decodeChunks(t), 2, "no chunk after the client left")
		harness.Eventually(t, 30*time.Second, "the engine stopped the cancelled chunk", func() bool { return running(t, r.decode) == 0 })
	})
}

// TestChunkedDecodeSplitSSEAndKVLoadFailure: a streamed nixlv2 split is
// chunked and token-exact; when its first chunk cannot load the remote KV
// the request degrades to a local prefill, itself chunked, before the
// client saw a byte: one stream, no error event.
func TestChunkedDecodeSplitSSEAndKVLoadFailure(t *testing.T) {
	forChunkDrivers(t, func(t *testing.T, r *chunkRig) {
		body := chunkChatBody(`,"max_tokens":10,"stream":true,"stream_options":{"include_usage":true}`)
		want := gjson.GetBytes(r.want(t, chunkChatBody(`,"max_tokens":10`)), "choices.0.message.content").String()

		st, text, events := scStream(t, r.sc.URL()+"/v1/chat/completions", body, r.header())
		require.Equal(t, http.StatusOK, st)
		assert.Equal(t, want, text, "token-exact")
		assert.Equal(t, "[DONE]", events[len(events)-1])
		assert.Equal(t, 1.0, r.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
		checkChunks(t, r.decodeChunks(t), 4, 4, 2)

		setFault(t, r.decode, `{"fail_kv_load":true,"only":"decode","times":1}`)
		st, text, events = scStream(t, r.sc.URL()+"/v1/chat/completions", body, r.header())
		require.Equal(t, http.StatusOK, st)
		assert.Equal(t, want, text, "nothing lost or duplicated")
		for _, e := range events {
			assert.False(t, gjson.Get(e, "error").Exists(), "no error reaches the client: %s", e)
		}
		assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "kv_load_failed"}))
		assert.Equal(t, 1.0, r.chunkMetric(t, "fallback"))
		assert.Equal(t, 2.0, r.chunkMetric(t, "completed"), "the split, then the fallback's local decode")
		assert.Equal(t, 1.0, r.decode.Metric(t, "sim_remote_kv_decodes_total", nil), "the failed pull did not count")
	})
}

// TestChunkedDecodeSlowChunksStream: chunks slow enough for the client
// connection to be watched while they run (past clientconn.WatchDelay) still stream
// to the end: the watch of a chunk that runs after the handler returned is
// no sign of the client leaving, and no request boundary for the event
// loops to take the connection at.
func TestChunkedDecodeSlowChunksStream(t *testing.T) {
	forChunkDrivers(t, func(t *testing.T, r *chunkRig) {
		want := gjson.GetBytes(r.want(t, chunkChatBody(`,"max_tokens":10`)), "choices.0.message.content").String()
		setFault(t, r.decode, `{"latency_ms":150,"skip":1,"times":2}`)
		for _, hdr := range []map[string]string{nil, r.header()} {
			st, text, events := scStream(t, r.sc.URL()+"/v1/chat/completions", chunkChatBody(`,"max_tokens":10,"stream":true`), hdr)
			require.Equal(t, http.StatusOK, st)
			assert.Equal(t, want, text, "every chunk's text arrived")
			assert.Equal(t, "[DONE]", events[len(events)-1])
			setFault(t, r.decode, `{"latency_ms":150,"skip":1,"times":2}`)
		}
		assert.Zero(t, r.chunkMetric(t, "client_left"))
		assert.Equal(t, 2.0, r.chunkMetric(t, "completed"))
	})
}

// TestChunkedDecodeSlowReader has a client with a small receive buffer stop
// reading a long chunked stream for a while: every chunk's text still
// arrives, in order, once (whether the sidecar had to hold bytes back for
// it depends on the kernel's socket buffers).
func TestChunkedDecodeSlowReader(t *testing.T) {
	forChunkDrivers(t, func(t *testing.T, r *chunkRig) {
		body := chunkChatBody(`,"max_tokens":3000,"stream":true`)
		want := gjson.GetBytes(r.want(t, chunkChatBody(`,"max_tokens":3000`)), "choices.0.message.content").String()
		conn, err := net.Dial("tcp", harness.HostPort(r.sc.Port))
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4<<10))
		_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		require.NoError(t, err)
		br := bufio.NewReaderSize(conn, 1<<10)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		time.Sleep(500 * time.Millisecond) // not reading: the chunks pile up (a sleep never ends early)
		text, events := readEvents(t, bufio.NewReader(resp.Body))
		assert.Equal(t, want, text, "every chunk's text, in order, once")
		assert.Equal(t, "[DONE]", events[len(events)-1])
		harness.Eventually(t, 30*time.Second, "the decode counted", func() bool { return r.chunkMetric(t, "completed") == 1 })
	})
}
