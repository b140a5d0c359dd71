package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// legEngine is a fake engine on raw TCP that records the head and body of
// every request it reads and answers each with what answer writes.
type legEngine struct {
	*harness.RawServer
	answer func(req *http.Request, body []byte) string
	mu     sync.Mutex
	legs   []engineLeg
}

// engineLeg is one request a legEngine read.
type engineLeg struct {
	method, path string
	header       http.Header
	body         []byte
}

func startLegEngine(t *testing.T, answer func(req *http.Request, body []byte) string) *legEngine {
	t.Helper()
	e := &legEngine{answer: answer}
	e.RawServer = harness.StartRawServer(t, func(c net.Conn) {
		harness.ServeRequests(c, func(c net.Conn, req *http.Request, body []byte) bool {
			e.mu.Lock()
			e.legs = append(e.legs, engineLeg{req.Method, req.URL.Path, req.Header.Clone(), body})
			e.mu.Unlock()
			_, err := io.WriteString(c, e.answer(req, body))
			return err == nil
		})
	})
	return e
}

// take returns the requests read so far and forgets them.
func (e *legEngine) take() []engineLeg {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.legs
	e.legs = nil
	return out
}

// completionAnswer is a completion answer, JSON or (stream) SSE, with
// extra lines in its head and the body members extra (",..." or "").
func completionAnswer(stream bool, head, extra string) string {
	if !stream {
		body := `{"id":"cmpl-f","object":"text_completion","model":"sim-model","choices":[{"index":0,"text":" fake answer","finish_reason":"length"}],` +
			`"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}` + extra + `}`
		return jsonAnswerHead(head, body)
	}
	return sseAnswerHead(head, `{"id":"cmpl-f","object":"text_completion","model":"sim-model","choices":[{"index":0,"text":" fake","finish_reason":null}]}`,
		`{"id":"cmpl-f","object":"text_completion","model":"sim-model","choices":[{"index":0,"text":" answer","finish_reason":"length"}]`+extra+`}`,
		"[DONE]")
}

// TestHostileConnectionOptions: a field that a Connection field names is
// for one hop (RFC 9110 §7.6.1). A client's (Connection: X-Hop-Secret)
// reaches no engine — local legs, a split's prefill and decode legs, a
// fallback's local leg, a passthrough request — and an engine's
// (Connection: X-Engine-Hop) reaches no client, JSON or stream; every other
// end-to-end field passes both ways, and a client's Connection: close still
// closes its connection after the answer. The engines are fakes on raw TCP
// that record every leg's head. On the lane (its requests counted) and on
// fasthttp's path.
func TestHostileConnectionOptions(t *testing.T) {
	const engineHead = "Connection: keep-alive, X-Engine-Hop\r\nX-Engine-Hop: e\r\nX-Engine-Kept: k\r\n"
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			local := startLegEngine(t, func(req *http.Request, body []byte) string {
				if req.URL.Path == "/v1/models" {
					return jsonAnswerHead(engineHead, `{"object":"list","data":[]}`)
				}
				return completionAnswer(gjson.GetBytes(body, "stream").Bool(), engineHead, "")
			})
			prefiller := startLegEngine(t, func(*http.Request, []byte) string {
				return prefillAnswer(nixlParams("127.0.0.1", 5600, ""))
			})
			dead := harness.FreePort(t) // nothing listens: the split falls back
			sc := harness.StartSidecar(t, local.Port(), mode.flags...)
			client := map[string]string{"Connection": "X-Hop-Secret", "X-Hop-Secret": "s", "X-Client-Kept": "c"}
			with := func(extra map[string]string) map[string]string {
				h := map[string]string{}
				for k, v := range client {
					h[k] = v
				}
				for k, v := range extra {
					h[k] = v
				}
				return h
			}
			cases := []struct {
				name    string
				headers map[string]string
				stream  bool
				legs    int // legs the prefiller reads
			}{
				{"local", nil, false, 0},
				{"local, streamed", nil, true, 0},
				{"split", map[string]string{"x-prefiller-host-port": prefiller.Addr()}, false, 1},
				{"split, streamed", map[string]string{"x-prefiller-host-port": prefiller.Addr()}, true, 1},
				{"fallback", map[string]string{"x-prefiller-host-port": harness.HostPort(dead)}, false, 0},
			}
			onLoops := sc.Metric(t, "pd_sidecar_loop_requests_total", nil)
			for _, tc := range cases {
				body := fmt.Sprintf(`{"model":"sim-model","prompt":"hello","max_tokens":4,"stream":%v}`, tc.stream)
				resp, b := exchangeRaw(t, sc.Port, "/v1/completions", body, with(tc.headers), mode.lane)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", tc.name, b)
				assert.Contains(t, string(b), "fake", tc.name)
				assertAnswerHead(t, tc.name, resp.Header)
				legs := local.take()
				require.Len(t, legs, 1, "%s: one local leg", tc.name)
				pre := prefiller.take()
				require.Len(t, pre, tc.legs, "%s: prefill legs", tc.name)
				for _, l := range append(legs, pre...) {
					assertLegHead(t, tc.name, l.header)
				}
				if tc.legs > 0 {
					assert.Equal(t, "evil", gjson.GetBytes(legs[0].body, "kv_transfer_params.remote_engine_id").String(), "%s: the decode leg carries the prefill's handoff", tc.name)
				}
			}
			if mode.lane {
				assert.Equal(t, onLoops+float64(len(cases)), sc.Metric(t, "pd_sidecar_loop_requests_total", nil), "the lane served them")
			}

			// A passthrough request: fasthttp's on both paths.
			conn, err := net.Dial("tcp", harness.HostPort(sc.Port))
			require.NoError(t, err)
			defer conn.Close()
			head := "GET /v1/models HTTP/1.1\r\nHost: x\r\n"
			for k, v := range client {
				head += k + ": " + v + "\r\n"
			}
			_, err = io.WriteString(conn, head+"\r\n")
			require.NoError(t, err)
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assertAnswerHead(t, "passthrough", resp.Header)
			legs := local.take()
			require.Len(t, legs, 1, "passthrough: one leg")
			assert.Equal(t, "/v1/models", legs[0].path)
			assertLegHead(t, "passthrough", legs[0].header)

			// Connection: close with an option: the answer says close, and the
			// connection closes after it.
			body := `{"model":"sim-model","prompt":"hello","max_tokens":4}`
			conn2 := postRaw(t, sc.Port, "/v1/completions", body, with(map[string]string{"Connection": "close, X-Hop-Secret"}), mode.lane)
			require.NoError(t, conn2.SetReadDeadline(time.Now().Add(10*time.Second)))
			br := bufio.NewReader(conn2)
			resp, err = http.ReadResponse(br, nil)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			assert.True(t, resp.Close, "Connection: close is kept")
			assertAnswerHead(t, "close", resp.Header)
			_, err = br.ReadByte()
			assert.ErrorIs(t, err, io.EOF, "the connection closed after the answer")
			legs = local.take()
			require.Len(t, legs, 1)
			assertLegHead(t, "close", legs[0].header)
		})
	}
}

// jsonAnswerHead is a 200 JSON answer with extra head lines.
func jsonAnswerHead(head, body string) string {
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", head, len(body), body)
}

// assertLegHead checks a leg's head: the client's connection option and
// its Connection field are not there, its other fields are.
func assertLegHead(t *testing.T, what string, h http.Header) {
	t.Helper()
	assert.Empty(t, h.Values("X-Hop-Secret"), "%s: the field the client's Connection names reached an engine: %v", what, h)
	assert.Empty(t, h.Values("Connection"), "%s: %v", what, h)
	assert.Equal(t, "c", h.Get("X-Client-Kept"), "%s: the client's other fields pass: %v", what, h)
}

// assertAnswerHead checks the client's answer head: the engine's
// connection option is not there, its other fields are.
func assertAnswerHead(t *testing.T, what string, h http.Header) {
	t.Helper()
	assert.Empty(t, h.Values("X-Engine-Hop"), "%s: the field the engine's Connection names reached the client: %v", what, h)
	assert.Equal(t, "k", h.Get("X-Engine-Kept"), "%s: the engine's other fields pass: %v", what, h)
	for _, v := range h.Values("Connection") {
		assert.NotContains(t, strings.ToLower(v), "x-engine-hop", what)
	}
}
