package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
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

// Client request framing, as a hostile client writes it on raw sockets:
// trailers, bare-LF lines, repeated request ids, header names that are not
// tokens, heads that cannot be parsed. Each case runs on the lane (the
// request whole in one write), on the lane's hand-over to fasthttp (the
// head in two writes) and on fasthttp alone (--stream-loops=0), and
// checks what the client received, byte-wise, whether the connection went
// on, and what the engines received.

// framingRig is a prefill and a decode engine-sim, and two sidecars in
// front of the decode engine: one with the lane, one without
// (--stream-loops=0).
type framingRig struct {
	prefill, decode *harness.Engine
	lane, plain     *harness.Sidecar
}

func newFramingRig(t *testing.T) *framingRig {
	t.Helper()
	r := &framingRig{prefill: harness.StartEngineSim(t, "prefill"), decode: harness.StartEngineSim(t, "decode")}
	r.lane = harness.StartSidecar(t, r.decode.Port)
	r.plain = harness.StartSidecar(t, r.decode.Port, "--stream-loops=0")
	return r
}

// framingPath is a way a request reaches the sidecar.
type framingPath struct {
	name  string
	plain bool // the sidecar without the lane
	split bool // the head in two writes (fasthttp's)
}

func framingPaths() []framingPath {
	return []framingPath{{"lane", false, false}, {"lane to fasthttp", false, true}, {"stream-loops=0", true, false}}
}

func (r *framingRig) sidecar(p framingPath) *harness.Sidecar {
	if p.plain {
		return r.plain
	}
	return r.lane
}

// forget clears both engines' request journals.
func (r *framingRig) forget(t *testing.T) {
	t.Helper()
	for _, e := range []*harness.Engine{r.prefill, r.decode} {
		req, err := http.NewRequest(http.MethodDelete, e.URL()+"/sim/requests", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
}

// rawClient is one client connection written and read byte-wise.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
	raw  bytes.Buffer // every byte received
}

func dialRaw(t *testing.T, sc *harness.Sidecar) *rawClient {
	t.Helper()
	conn, err := net.Dial("tcp", harness.HostPort(sc.Port))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	c := &rawClient{t: t, conn: conn}
	c.br = bufio.NewReader(io.TeeReader(conn, &c.raw))
	return c
}

// send writes the parts, 30 ms apart (a part is a read of its own).
func (c *rawClient) send(parts ...string) {
	c.t.Helper()
	for i, p := range parts {
		if i > 0 {
			time.Sleep(30 * time.Millisecond)
		}
		_, err := io.WriteString(c.conn, p)
		require.NoError(c.t, err)
	}
}

// answer reads one answer (within 30 s): its status, head and body, and
// the bytes received for it.
func (c *rawClient) answer() (*http.Response, []byte, string) {
	c.t.Helper()
	require.NoError(c.t, c.conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	from := c.raw.Len() - c.br.Buffered()
	resp, err := http.ReadResponse(c.br, nil)
	require.NoError(c.t, err, "received %q", c.raw.String())
	body, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	resp.Body.Close()
	got := c.raw.Bytes()[from : c.raw.Len()-c.br.Buffered()]
	return resp, body, string(got)
}

// closed asserts that the sidecar closes the connection with nothing more
// written (within 30 s).
func (c *rawClient) closed() {
	c.t.Helper()
	require.NoError(c.t, c.conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	b, err := c.br.ReadByte()
	if err == nil {
		rest, _ := io.ReadAll(c.br)
		c.t.Fatalf("the connection went on: %q", append([]byte{b}, rest...))
	}
	var ne net.Error
	require.False(c.t, errors.As(err, &ne) && ne.Timeout(), "the connection is still open")
}

// request is a request with a Content-Length body and extra header lines,
// as parts: whole, or the request line and the rest (a head in two
// writes: fasthttp's).
func request(method, target, body string, split bool, headers ...string) []string {
	head := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n",
		method, target, len(body), strings.Join(headers, ""))
	if split {
		line := strings.Index(head, "\r\n") + 2
		return []string{head[:line], head[line:] + body}
	}
	return []string{head + body}
}

// chunked is a request with a chunked body and a trailer section.
func chunked(body string, trailer ...string) string {
	return fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n%s\r\n",
		len(body), body, strings.Join(trailer, ""))
}

// TestFramingTrailersNeverRoute: a chunked request's trailer section names
// a prefiller (any letter case, no Trailer declared), a request id and a
// header of its own. No split happens, neither engine sees any of those
// fields, the request id is the sidecar's, and the connection serves the
// next request. A head that names a prefiller keeps it whatever the
// trailers say, and a Trailer declaration in a head is no field the lane
// forwards.
func TestFramingTrailersNeverRoute(t *testing.T) {
	rig := newFramingRig(t)
	body := completionBody(`,"max_tokens":3`)
	for _, p := range framingPaths() {
		t.Run(p.name, func(t *testing.T) {
			sc := rig.sidecar(p)
			t.Run("trailers only", func(t *testing.T) {
				rig.forget(t)
				c := dialRaw(t, sc)
				c.send(chunked(body, "X-PREFILLER-host-port: "+rig.prefill.HostPort()+"\r\n",
					"X-Smuggled: 1\r\n", "X-Request-Id: trailer-id\r\n"))
				resp, b, raw := c.answer()
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
				assert.True(t, strings.HasPrefix(raw, "HTTP/1.1 200 OK\r\n"), raw)
				assert.NotEqual(t, "trailer-id", resp.Header.Get("X-Request-Id"))
				assert.NotEmpty(t, textOf(b))
				assert.Empty(t, journal(t, rig.prefill), "no split")
				got := journal(t, rig.decode)
				require.Len(t, got, 1)
				assert.JSONEq(t, body, string(got[0].Body))
				for _, k := range []string{"x-prefiller-host-port", "x-smuggled", "trailer"} {
					assert.Empty(t, got[0].Headers[k], k)
				}
				assert.Equal(t, []string{resp.Header.Get("X-Request-Id")}, got[0].Headers["x-request-id"])

				c.send(request("POST", "/v1/completions", body, p.split)...)
				resp, _, raw = c.answer()
				require.Equal(t, http.StatusOK, resp.StatusCode, "the next request: %s", raw)
				assert.Len(t, journal(t, rig.decode), 2)
			})
			t.Run("head wins", func(t *testing.T) {
				rig.forget(t)
				c := dialRaw(t, sc)
				c.send(strings.Replace(chunked(body, "x-prefiller-host-port: 127.0.0.1:1\r\n"),
					"Host: x\r\n", "Host: x\r\nx-prefiller-host-port: "+rig.prefill.HostPort()+"\r\nTrailer: x-prefiller-host-port\r\n", 1))
				resp, _, raw := c.answer()
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
				require.Len(t, journal(t, rig.prefill), 1, "split to the head's prefiller")
				for _, e := range []*harness.Engine{rig.prefill, rig.decode} {
					for _, r := range journal(t, e) {
						assert.Empty(t, r.Headers["x-prefiller-host-port"])
						assert.Empty(t, r.Headers["trailer"])
					}
				}
			})
			t.Run("declared, with a Content-Length body", func(t *testing.T) {
				rig.forget(t)
				c := dialRaw(t, sc)
				c.send(request("POST", "/v1/completions", body, p.split, "Trailer: x-prefiller-host-port\r\n")...)
				resp, _, raw := c.answer()
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
				assert.Empty(t, journal(t, rig.prefill))
				got := journal(t, rig.decode)
				require.Len(t, got, 1)
				assert.Empty(t, got[0].Headers["trailer"])
			})
		})
	}
}

// TestFramingBareLFAndHandBack: a request line ended by a bare LF, or
// preceded by blank lines, is counted as the parser took it: the next
// request on the connection is served whole (the case: the lane
// and fasthttp disagreed by one byte, fasthttp answered 400 to the next
// request's first byte, and the lane served the rest). After an answer
// that says Connection: close, the connection closes and nothing behind
// it reaches an engine.
func TestFramingBareLFAndHandBack(t *testing.T) {
	rig := newFramingRig(t)
	body := completionBody(`,"max_tokens":2`)
	for _, p := range framingPaths() {
		t.Run(p.name, func(t *testing.T) {
			sc := rig.sidecar(p)
			for _, odd := range []struct{ name, from, to string }{
				{"bare LF request line", "HTTP/1.1\r\n", "HTTP/1.1\n"},
				{"blank lines first", "POST ", "\r\n\nPOST "},
			} {
				t.Run(odd.name, func(t *testing.T) {
					rig.forget(t)
					c := dialRaw(t, sc)
					parts := request("POST", "/v1/completions", body, p.split)
					parts[0] = strings.Replace(parts[0], odd.from, odd.to, 1)
					for i := range 3 {
						c.send(parts...)
						resp, b, raw := c.answer()
						require.Equal(t, http.StatusOK, resp.StatusCode, "request %d: %s", i, raw)
						assert.Empty(t, resp.Header.Get("Connection"), raw)
						assert.NotEmpty(t, textOf(b))
						time.Sleep(50 * time.Millisecond) // the next request in a read of its own
						parts = request("POST", "/v1/completions", body, p.split)
					}
					got := journal(t, rig.decode)
					require.Len(t, got, 3)
					for _, r := range got {
						assert.Equal(t, "/v1/completions", r.Path)
						assert.JSONEq(t, body, string(r.Body))
					}
				})
			}
			t.Run("closes after a 400", func(t *testing.T) {
				rig.forget(t)
				c := dialRaw(t, sc)
				parts := request("POST", "/v1/completions", body, p.split, "X-Bad: a\x01b\r\n")
				c.send(parts...)
				resp, b, raw := c.answer()
				require.Equal(t, http.StatusBadRequest, resp.StatusCode, raw)
				assert.True(t, strings.HasPrefix(raw, "HTTP/1.1 400 Bad Request\r\n"), raw)
				assert.Contains(t, raw, "\r\nConnection: close\r\n")
				assert.Equal(t, int64(400), gjson.GetBytes(b, "error.code").Int())
				_, _ = io.WriteString(c.conn, request("POST", "/v1/completions", body, false)[0])
				c.closed()
				assert.Empty(t, journal(t, rig.decode))
			})
		})
	}
}

// TestFramingOneRequestID: a request carrying two X-Request-Id headers
// reaches every engine, on every leg (local, the P/D split's prefill and
// decode, passthrough), with exactly one: the client's first.
func TestFramingOneRequestID(t *testing.T) {
	rig := newFramingRig(t)
	body := completionBody(`,"max_tokens":2`)
	ids := []string{"X-Request-Id: one\r\n", "x-request-id: two\r\n"}
	for _, p := range framingPaths() {
		t.Run(p.name, func(t *testing.T) {
			sc := rig.sidecar(p)
			for _, tc := range []struct {
				name, method, target string
				pd                   bool
			}{
				{"local", "POST", "/v1/completions", false},
				{"split", "POST", "/v1/completions", true},
				{"passthrough", "GET", "/v1/models", false},
			} {
				t.Run(tc.name, func(t *testing.T) {
					rig.forget(t)
					hdr := ids
					if tc.pd {
						hdr = append([]string{"x-prefiller-host-port: " + rig.prefill.HostPort() + "\r\n"}, ids...)
					}
					b := body
					if tc.method == "GET" {
						b = ""
					}
					c := dialRaw(t, sc)
					c.send(request(tc.method, tc.target, b, p.split && b != "", hdr...)...)
					resp, _, raw := c.answer()
					require.Equal(t, http.StatusOK, resp.StatusCode, raw)
					engines := []*harness.Engine{rig.decode}
					if tc.pd {
						engines = append(engines, rig.prefill)
					}
					for _, e := range engines {
						got := journal(t, e)
						require.Len(t, got, 1)
						assert.Equal(t, []string{"one"}, got[0].Headers["x-request-id"], "%s", e.HostPort())
					}
					if tc.method == "POST" {
						assert.Equal(t, []string{"one"}, resp.Header.Values("X-Request-Id"))
					}
				})
			}
		})
	}
}

// TestFramingRefusesBadHeaderNames: a header name with an inner space is
// refused 400 JSON, counted as malformed, and the connection closes;
// nothing reaches the engine.
func TestFramingRefusesBadHeaderNames(t *testing.T) {
	rig := newFramingRig(t)
	body := completionBody(`,"max_tokens":2`)
	for _, p := range framingPaths() {
		t.Run(p.name, func(t *testing.T) {
			sc := rig.sidecar(p)
			rig.forget(t)
			before := sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": "malformed"})
			c := dialRaw(t, sc)
			c.send(request("POST", "/v1/completions", body, p.split, "X Foo: bar\r\n")...)
			resp, b, raw := c.answer()
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, raw)
			assert.True(t, strings.HasPrefix(raw, "HTTP/1.1 400 Bad Request\r\n"), raw)
			assert.Contains(t, raw, "\r\nConnection: close\r\n")
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			assert.Equal(t, int64(400), gjson.GetBytes(b, "error.code").Int())
			assert.NotContains(t, string(b), "X Foo")
			c.closed()
			assert.Empty(t, journal(t, rig.decode))
			assert.Equal(t, before+1, sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": "malformed"}))
		})
	}
}

// TestFramingNeverEchoesRequests: whatever makes a request unparsable, the
// 400 answer and the sidecar's log say what was wrong without quoting the
// request: no Authorization token, no query-string secret, no header
// value.
func TestFramingNeverEchoesRequests(t *testing.T) {
	rig := newFramingRig(t)
	body := completionBody(`,"max_tokens":2`)
	const secret = "sk-SECRET-0123456789"
	auth := "Authorization: Bearer " + secret + "\r\n"
	cases := []struct {
		name  string
		parts func(split bool) []string
	}{
		{"control byte in a value", func(split bool) []string {
			return request("POST", "/v1/completions", body, split, auth, "X-Bad: "+secret+"\x01\r\n")
		}},
		{"bad version", func(split bool) []string {
			return request("POST", "/v1/completions?key="+secret, body, split, auth)
		}},
		{"bad content length", func(bool) []string {
			return []string{"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 1" + secret + "\r\n\r\n{}"}
		}},
		{"no colon", func(bool) []string {
			return []string{"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth + secret + "\r\nContent-Length: 2\r\n\r\n{}"}
		}},
		{"bad request target", func(bool) []string {
			return []string{"POST v1/completions?key=" + secret + " HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 2\r\n\r\n{}"}
		}},
		{"bad name", func(split bool) []string {
			return request("POST", "/v1/completions", body, split, auth, "X "+secret+": 1\r\n")
		}},
	}
	for _, p := range framingPaths() {
		t.Run(p.name, func(t *testing.T) {
			sc := rig.sidecar(p)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					c := dialRaw(t, sc)
					parts := tc.parts(p.split)
					if tc.name == "bad version" {
						parts[0] = strings.Replace(parts[0], "HTTP/1.1\r\n", "HTTP/"+secret+"\r\n", 1)
					}
					c.send(parts...)
					resp, _, raw := c.answer()
					require.Equal(t, http.StatusBadRequest, resp.StatusCode, raw)
					assert.NotContains(t, raw, "SECRET")
					assert.NotContains(t, raw, "Bearer")
					c.closed()
				})
			}
			time.Sleep(100 * time.Millisecond) // the last log lines
			assert.NotContains(t, sc.Output(), "SECRET", "the sidecar's log")
			assert.NotContains(t, sc.Output(), "Bearer", "the sidecar's log")
		})
	}
	assert.Empty(t, journal(t, rig.decode))
}
