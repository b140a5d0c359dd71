package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// A hostile upstream answers the sidecar with bytes a test scripts, on raw
// TCP: it plays a prefiller, a Mooncake bootstrap server or the local
// engine answering what no real engine would. Whatever it sends, the
// sidecar must not crash or hang, must answer its client with a
// well-framed answer (a local fallback, or a JSON error), must serve the
// client's next request on the same connection, and must count what
// happened; on the lane and on fasthttp's path alike.

// hostileUpstream is a raw TCP server that reads requests and answers each
// with a scripted answer.
type hostileUpstream struct {
	*harness.RawServer
	reqs atomic.Int64 // requests read
	// lateDue counts bad answers followed by a late one, lateDone the late
	// answers written (or found impossible to write).
	lateDue, lateDone atomic.Int64

	mu     sync.Mutex
	script hostileScript
}

// hostileScript is how the hostile upstream answers.
type hostileScript struct {
	// bad answers the first `times` requests (every one when times is 0);
	// good the others.
	bad   string
	times int64
	good  string
	// hang: after bad, the connection stays silent (a head that never
	// ends when bad is a head's beginning).
	hang bool
	// late is written on the connection 100 ms after bad, while no
	// request is outstanding: an answer to a request never sent.
	late string
}

func startHostile(t *testing.T, s hostileScript) *hostileUpstream {
	t.Helper()
	h := &hostileUpstream{script: s}
	h.RawServer = harness.StartRawServer(t, func(c net.Conn) { harness.ServeRequests(c, h.answer) })
	return h
}

// waitLate waits until every late answer due so far has been written on
// its connection (or the connection was gone): the next request then meets
// it, wherever the sidecar left that connection.
func (h *hostileUpstream) waitLate(t *testing.T) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, "the late answers written", func() bool {
		return h.lateDone.Load() >= h.lateDue.Load()
	})
}

// answer writes the script's answer to the request just read on c, and
// says whether c serves another.
func (h *hostileUpstream) answer(c net.Conn, _ *http.Request, _ []byte) bool {
	n := h.reqs.Add(1)
	h.mu.Lock()
	s := h.script
	h.mu.Unlock()
	if s.times > 0 && n > s.times {
		_, err := io.WriteString(c, s.good)
		return err == nil
	}
	late := s.late != "" && !s.hang
	if late {
		h.lateDue.Add(1)
	}
	if _, err := io.WriteString(c, s.bad); err != nil {
		if late {
			h.lateDone.Add(1)
		}
		return false
	}
	if s.hang {
		_, _ = io.Copy(io.Discard, c) // until the sidecar closes it
		return false
	}
	if late {
		time.Sleep(100 * time.Millisecond) // while no request is outstanding
		_, err := io.WriteString(c, s.late)
		h.lateDone.Add(1)
		if err != nil {
			return false
		}
	}
	return true
}

// jsonAnswer is a complete answer with a JSON body.
func jsonAnswer(status int, body string) string {
	return fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
}

// forged is an answer smuggled after a bodiless one: a client that saw it
// would take it as the sidecar's.
const forged = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"forged\":\"yes\"}\n"

// hostileAnswers are the malformed answers every role is tried with.
// status is what the client gets when the hostile upstream is the local
// engine (a prefiller's bad answer always falls back, with reason).
var hostileAnswers = []struct {
	name    string
	script  hostileScript
	engine  int    // the client's status when the engine answers so
	reason  string // the fallback reason when a prefiller answers so
	bounded bool   // run with a small --max-upstream-answer-bytes
}{
	{name: "content-length 2^49", script: hostileScript{bad: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 562949953421312\r\n\r\n{}"},
		engine: 502, reason: "bad_answer"},
	{name: "content-length 1e11", script: hostileScript{bad: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000000\r\n\r\n{}"},
		engine: 502, reason: "bad_answer"},
	{name: "negative content-length", script: hostileScript{bad: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: -5\r\n\r\n{}"},
		engine: 502, reason: "bad_answer"},
	{name: "chunk size that overflows", script: hostileScript{bad: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000000000002\r\n{}\r\n0\r\n\r\n"},
		engine: 502, reason: "bad_answer"},
	{name: "chunked past the bound", bounded: true,
		script: hostileScript{bad: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
			strings.Repeat("4000\r\n"+strings.Repeat(" ", 0x4000)+"\r\n", 8) + "0\r\n\r\n"},
		engine: 502, reason: "bad_answer"},
	{name: "101 with a body", script: hostileScript{bad: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n" + forged + forged},
		engine: 502, reason: "bad_answer"},
	{name: "102 then nothing more", script: hostileScript{bad: "HTTP/1.1 102 Processing\r\n\r\n" + forged},
		engine: 502, reason: "bad_answer"},
	{name: "204 with a body", script: hostileScript{bad: "HTTP/1.1 204 No Content\r\nContent-Length: 80\r\n\r\n" + forged},
		engine: 204, reason: "bad_answer"},
	{name: "304 with a body", script: hostileScript{bad: "HTTP/1.1 304 Not Modified\r\nContent-Type: application/json\r\n\r\n" + forged},
		engine: 304, reason: "bad_answer"},
	{name: "garbage after a valid answer", script: hostileScript{bad: jsonAnswer(500, `{"error":"busy"}`) + forged},
		engine: 500, reason: "server_error"},
	{name: "an answer to a request not sent", script: hostileScript{bad: jsonAnswer(500, `{"error":"busy"}`), late: forged},
		engine: 500, reason: "server_error"},
}

// hostileFlags keep every bound short: the cases must end fast.
// Every request meets its prefiller (no circuit breaker).
var hostileFlags = []string{"--prefill-timeout", "1s", "--prefill-max-retries", "0", "--decode-first-byte-timeout", "1s",
	"--circuit-breaker-failures", "0"}

// exchangeOn sends a request on conn (whole in one write: the lane's; or
// its head in two writes: fasthttp's) and reads its answer whole,
// requiring it well-framed within 30 s.
func exchangeOn(t *testing.T, conn net.Conn, br *bufio.Reader, path, body string, headers map[string]string, whole bool) (*http.Response, []byte) {
	t.Helper()
	writeRequest(t, conn, path, body, headers, whole)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodPost})
	require.NoError(t, err, "a well-framed answer in time")
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "a well-framed body")
	return resp, b
}

// nothingMore requires that the sidecar sent nothing after the answers
// read from br (no forged answer, no stray body).
func nothingMore(t *testing.T, conn net.Conn, br *bufio.Reader) {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(150*time.Millisecond)))
	b, err := br.Peek(1)
	require.Error(t, err, "bytes after the answer: %q", b)
}

// alive requires the sidecar process up and answering /health.
func alive(t *testing.T, sc *harness.Sidecar) {
	t.Helper()
	require.False(t, sc.Exited(), "the sidecar exited:\n%s", tail(sc.Output()))
	resp, err := http.Get(sc.URL() + "/health")
	require.NoError(t, err)
	resp.Body.Close()
}

func tail(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}

func TestHostilePrefiller(t *testing.T) {
	body := completionBody(`,"max_tokens":4`)
	for _, tc := range hostileAnswers {
		t.Run(tc.name, func(t *testing.T) {
			h := startHostile(t, tc.script)
			decode := harness.StartEngineSim(t, "decode")
			flags := hostileFlags
			if tc.bounded {
				flags = append(flags, "--max-upstream-answer-bytes", "65536")
			}
			sc := harness.StartSidecar(t, decode.Port, flags...)
			hdr := map[string]string{"x-prefiller-host-port": h.Addr()}
			for _, whole := range []bool{true, false} {
				conn, err := net.Dial("tcp", harness.HostPort(sc.Port))
				require.NoError(t, err)
				br := bufio.NewReader(conn)
				before := sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": tc.reason})
				conns := h.Conns()
				for i := range 2 { // the second on the same client connection
					resp, b := exchangeOn(t, conn, br, "/v1/completions", body, hdr, whole)
					require.Equal(t, http.StatusOK, resp.StatusCode, "request %d (whole: %v): %s", i, whole, b)
					assert.NotEmpty(t, textOf(b), "a local answer (whole: %v): %s", whole, b)
					assert.NotContains(t, string(b), "forged")
					if tc.script.late != "" {
						h.waitLate(t) // the late answer came
					}
				}
				nothingMore(t, conn, br)
				conn.Close()
				alive(t, sc)
				assert.Equal(t, before+2, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": tc.reason}),
					"two fallbacks for %s (whole: %v)", tc.reason, whole)
				// A connection the prefiller sent anything on past its
				// answer is not used again.
				assert.Equal(t, conns+2, h.Conns(), "a connection per request (whole: %v)", whole)
			}
		})
	}
	t.Run("head that never ends", func(t *testing.T) {
		h := startHostile(t, hostileScript{bad: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: ", hang: true})
		decode := harness.StartEngineSim(t, "decode")
		sc := harness.StartSidecar(t, decode.Port, hostileFlags...)
		hdr := map[string]string{"x-prefiller-host-port": h.Addr()}
		for _, whole := range []bool{true, false} {
			conn, err := net.Dial("tcp", harness.HostPort(sc.Port))
			require.NoError(t, err)
			br := bufio.NewReader(conn)
			within(t, 20*time.Second, func() { // the 1 s timeouts bound it; the upstream never ends
				resp, b := exchangeOn(t, conn, br, "/v1/completions", body, hdr, whole)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			})
			conn.Close()
		}
		alive(t, sc)
		assert.Equal(t, 2.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "timeout"}))
	})
}

func TestHostileEngine(t *testing.T) {
	body := completionBody(`,"max_tokens":4`)
	good := jsonAnswer(200, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" fine","finish_reason":"length"}]}`)
	for _, tc := range hostileAnswers {
		t.Run(tc.name, func(t *testing.T) {
			for _, whole := range []bool{true, false} {
				s := tc.script
				s.times, s.good = 1, good
				h := startHostile(t, s)
				flags := hostileFlags
				if tc.bounded {
					flags = append(flags, "--max-upstream-answer-bytes", "65536")
				}
				sc := harness.StartSidecar(t, h.Port(), flags...)
				conn, err := net.Dial("tcp", harness.HostPort(sc.Port))
				require.NoError(t, err)
				br := bufio.NewReader(conn)
				resp, b := exchangeOn(t, conn, br, "/v1/completions", body, nil, whole)
				require.Equal(t, tc.engine, resp.StatusCode, "whole: %v: %s", whole, b)
				assert.NotContains(t, string(b), "forged")
				if tc.engine == 502 {
					assert.Equal(t, int64(502), gjson.GetBytes(b, "error.code").Int(), "a JSON error: %s", b)
				}
				if tc.engine == 204 || tc.engine == 304 {
					assert.Empty(t, b)
				}
				if s.late != "" {
					h.waitLate(t) // the late answer came
				}
				resp, b = exchangeOn(t, conn, br, "/v1/completions", body, nil, whole)
				require.Equal(t, http.StatusOK, resp.StatusCode, "the next request (whole: %v): %s", whole, b)
				assert.Contains(t, textOf(b), " fine", "the next request's own answer (whole: %v)", whole)
				nothingMore(t, conn, br)
				conn.Close()
				alive(t, sc)
				assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"code": itoa(tc.engine)}),
					"whole: %v", whole)
			}
		})
	}
	t.Run("head that never ends", func(t *testing.T) {
		stream := chatBody(`,"max_tokens":4,"stream":true`)
		for _, whole := range []bool{true, false} {
			h := startHostile(t, hostileScript{bad: "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Slow: ", hang: true})
			sc := harness.StartSidecar(t, h.Port(), hostileFlags...)
			conn, err := net.Dial("tcp", harness.HostPort(sc.Port))
			require.NoError(t, err)
			br := bufio.NewReader(conn)
			within(t, 20*time.Second, func() { // the 1 s timeouts bound it; the upstream never ends
				resp, b := exchangeOn(t, conn, br, "/v1/chat/completions", stream, nil, whole)
				require.Equal(t, http.StatusGatewayTimeout, resp.StatusCode, "%s", b)
				assert.Equal(t, int64(504), gjson.GetBytes(b, "error.code").Int(), "a JSON error: %s", b)
			})
			conn.Close()
			alive(t, sc)
		}
	})
}

func TestHostileBootstrap(t *testing.T) {
	chat := chatBody(`,"max_tokens":4,"stream":true`)
	for _, tc := range hostileAnswers {
		if tc.reason != "bad_answer" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			h := startHostile(t, tc.script)
			prefill := harness.StartEngineSim(t, "prefill")
			decode := harness.StartEngineSim(t, "decode")
			flags := append([]string{"--kv-connector", "mooncake", "--mooncake-bootstrap-port", itoa(h.Port())}, hostileFlags...)
			if tc.bounded {
				flags = append(flags, "--max-upstream-answer-bytes", "65536")
			}
			sc := harness.StartSidecar(t, decode.Port, flags...)
			hdr := map[string]string{"x-prefiller-host-port": prefill.HostPort()}
			for _, whole := range []bool{true, false} {
				conn, err := net.Dial("tcp", harness.HostPort(sc.Port))
				require.NoError(t, err)
				br := bufio.NewReader(conn)
				resp, b := exchangeOn(t, conn, br, "/v1/chat/completions", chat, hdr, whole)
				require.Equal(t, http.StatusOK, resp.StatusCode, "whole: %v: %s", whole, b)
				assert.NotEmpty(t, answerOf(b))
				assert.NotContains(t, string(b), "forged")
				resp, b = exchangeOn(t, conn, br, "/v1/chat/completions", chat, hdr, whole)
				require.Equal(t, http.StatusOK, resp.StatusCode, "the next request (whole: %v): %s", whole, b)
				nothingMore(t, conn, br)
				conn.Close()
				alive(t, sc)
			}
			assert.Equal(t, 4.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "bootstrap_failed"}))
		})
	}
}

// TestLaneSplitMalformedAnswersAsTheServer is TestLaneSplitAnswersAsTheServer
// for a prefiller's malformed answers: sent whole (the lane's) or with its
// head in two writes (fasthttp's), a request gets the same answer and
// the sidecar counts the same.
func TestLaneSplitMalformedAnswersAsTheServer(t *testing.T) {
	completion := completionBody(`,"max_tokens":6`)
	stream := chatBody(`,"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}`)
	for _, tc := range hostileAnswers {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			body := completion
			if path != "/v1/completions" {
				body = stream
			}
			t.Run(tc.name+" "+path, func(t *testing.T) {
				run := func(whole bool) splitOutcome {
					h := startHostile(t, tc.script)
					decode := harness.StartEngineSim(t, "decode")
					flags := hostileFlags
					if tc.bounded {
						flags = append(flags, "--max-upstream-answer-bytes", "65536")
					}
					sc := harness.StartSidecar(t, decode.Port, flags...)
					o := sendRaw(t, sc.Port, path, body, map[string]string{"x-prefiller-host-port": h.Addr()}, whole, 0)
					harness.Eventually(t, 30*time.Second, "the request ended", func() bool {
						return sc.Metric(t, "pd_sidecar_inflight_requests", nil) == 0
					})
					want := 0.0
					if whole {
						want = 1
					}
					assert.Equal(t, want, sc.Metric(t, laneRequests, nil), "the lane's requests (whole: %v)", whole)
					o.sidecar = series(harness.Scrape(t, sc.URL()+"/metrics"), splitCountered)
					o.decode = series(harness.Scrape(t, decode.URL()+"/metrics"), engineCountered)
					return o
				}
				lane, server := run(true), run(false)
				require.Equal(t, http.StatusOK, server.status, "fasthttp's answer: %s", server.answer)
				assert.Equal(t, server.status, lane.status, "status")
				assert.Equal(t, server.answer, lane.answer, "answer")
				assert.Equal(t, server.sidecar, lane.sidecar, "the sidecar's counts")
				assert.Equal(t, server.decode, lane.decode, "the decode engine's counts")
			})
		}
	}
}
