package e2e

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// secretMarker is in every answer of secretAnswers: it must reach neither
// a client nor the sidecar's log.
const secretMarker = "SECRET"

// secretAnswers are malformed upstream answers that carry a secret: a
// session cookie in a head that does not parse, garbage, a chunked body
// that breaks, a head past the read buffer. fasthttp's parser errors quote
// such heads whole.
var secretAnswers = []struct{ name, answer string }{
	{"bad content-length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nSet-Cookie: session=SECRET-cl\r\nContent-Length: zz\r\n\r\n{}"},
	{"bad status", "HTTP/1.1 2OO SECRET-status\r\nSet-Cookie: session=SECRET-status\r\nContent-Length: 2\r\n\r\n{}"},
	{"garbage", "SECRET-garbage\x00\x01\xfe\xff\r\nSet-Cookie: session=SECRET-garbage\r\n\r\n"},
	{"bad chunk", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nSet-Cookie: session=SECRET-chunk\r\nTransfer-Encoding: chunked\r\n\r\nSECRET-chunk\r\n{}\r\n0\r\n\r\n"},
	{"head too long", "HTTP/1.1 200 OK\r\nSet-Cookie: session=SECRET-long" + strings.Repeat("a", 12<<10) + "\r\nContent-Length: 2\r\n\r\n{}"},
	{"switching protocols", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: SECRET-101\r\nConnection: Upgrade\r\n\r\nSECRET-101"},
}

// bothPaths are the two serving paths: the lane (the default) and
// fasthttp's alone.
var bothPaths = []struct {
	name  string
	flags []string
}{
	{"lane", nil},
	{"stream-loops=0", []string{"--stream-loops=0"}},
}

// exchangeBytes sends one request whole on a new connection and returns the
// raw bytes of the answer (until the sidecar closes the connection or 5 s
// pass) and the answer parsed.
func exchangeBytes(t *testing.T, port int, path, body string, headers map[string]string) ([]byte, *http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", harness.HostPort(port))
	require.NoError(t, err)
	defer conn.Close()
	writeRequest(t, conn, path, body, headers, true)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	var raw bytes.Buffer
	resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(conn, &raw)), &http.Request{Method: http.MethodPost})
	require.NoError(t, err, "a well-framed answer: %q", raw.String())
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return raw.Bytes(), resp, b
}

// quietLog requires that the sidecar's log holds no secret (after the
// last lines were written).
func quietLog(t *testing.T, sc *harness.Sidecar) {
	t.Helper()
	time.Sleep(100 * time.Millisecond)
	out := sc.Output()
	if i := strings.Index(out, secretMarker); i >= 0 {
		t.Fatalf("the sidecar's log quotes the upstream: %q", out[max(i-300, 0):min(i+100, len(out))])
	}
}

// TestHostileAnswersAreNeverQuoted: a local engine, a prefiller and a
// bootstrap server that answer malformed heads holding a secret: the
// client's answer is a JSON error saying which upstream failed and why (or
// the local fallback for a prefiller), never the upstream's bytes nor the
// local engine's address; the sidecar's log says the same and names the
// upstream's address in a field, never its bytes. On the lane and on
// fasthttp's path; JSON and streamed requests.
func TestHostileAnswersAreNeverQuoted(t *testing.T) {
	json := completionBody(`,"max_tokens":4`)
	stream := chatBody(`,"max_tokens":4,"stream":true`)
	for _, p := range bothPaths {
		t.Run(p.name, func(t *testing.T) {
			for _, tc := range secretAnswers {
				t.Run(tc.name, func(t *testing.T) {
					h := startHostile(t, hostileScript{bad: tc.answer})
					engine := harness.StartSidecar(t, h.Port(), append(append([]string{}, hostileFlags...), p.flags...)...)
					decode := harness.StartEngineSim(t, "decode")
					pd := harness.StartSidecar(t, decode.Port, append(append([]string{}, hostileFlags...), p.flags...)...)
					strict := harness.StartSidecar(t, decode.Port, append(append([]string{"--prefill-fallback=false"}, hostileFlags...), p.flags...)...)
					named := map[string]string{"x-prefiller-host-port": h.Addr()}
					for _, req := range []struct{ path, body string }{{"/v1/completions", json}, {"/v1/chat/completions", stream}} {
						// The local engine: a 502 that says so.
						raw, resp, b := exchangeBytes(t, engine.Port, req.path, req.body, nil)
						assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s", raw)
						assert.NotContains(t, string(raw), secretMarker)
						assert.NotContains(t, string(raw), h.Addr(), "the engine's address")
						assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "local engine: answer refused", "%s", b)

						// A prefiller: the local fallback, or (without it) a 502
						// that says so.
						raw, resp, b = exchangeBytes(t, pd.Port, req.path, req.body, named)
						assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
						assert.NotEmpty(t, answerOf(b), "the local answer")
						assert.NotContains(t, string(raw), secretMarker)
						raw, resp, b = exchangeBytes(t, strict.Port, req.path, req.body, named)
						assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s", raw)
						assert.NotContains(t, string(raw), secretMarker)
						assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "prefiller: answer refused", "%s", b)
					}
					assert.Equal(t, 2.0, engine.Metric(t, "pd_sidecar_requests_total", map[string]string{"code": "502"}))
					assert.Equal(t, 2.0, pd.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "bad_answer"}))
					assert.Equal(t, 2.0, strict.Metric(t, "pd_sidecar_requests_total", map[string]string{"code": "502"}))
					for _, sc := range []*harness.Sidecar{engine, pd, strict} {
						alive(t, sc)
						quietLog(t, sc)
					}
					assert.Contains(t, engine.Output(), `"upstream":"`+h.Addr()+`"`, "the log names the upstream")
				})
			}
		})
	}
	t.Run("bootstrap server", func(t *testing.T) {
		for _, tc := range secretAnswers {
			t.Run(tc.name, func(t *testing.T) {
				h := startHostile(t, hostileScript{bad: tc.answer})
				prefill := harness.StartEngineSim(t, "prefill")
				decode := harness.StartEngineSim(t, "decode")
				sc := harness.StartSidecar(t, decode.Port, append([]string{"--kv-connector", "mooncake",
					"--mooncake-bootstrap-port", itoa(h.Port()), "--prefill-fallback=false"}, hostileFlags...)...)
				raw, resp, b := exchangeBytes(t, sc.Port, "/v1/chat/completions", stream, map[string]string{"x-prefiller-host-port": prefill.HostPort()})
				assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s", raw)
				assert.NotContains(t, string(raw), secretMarker)
				assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "bootstrap server: answer refused", "%s", b)
				alive(t, sc)
				quietLog(t, sc)
			})
		}
	})
}
