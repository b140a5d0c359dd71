package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// HTTP conformance, and what the lane and fasthttp's path must agree on: a
// client that half-closes after its request, a body that stalls, a Host
// that is no host:port, HTTP versions other than 1.0 and 1.1, HTTP/1.0
// framing and keep-alive, request targets not in normal form. Each case
// runs on a sidecar with the lane (the default) and on one without
// (--stream-loops=0), on raw sockets, and requires from both the same
// answers (status, protocol, framing, Connection), the same end of the
// connection, the same counters and the same requests at the engine; then
// what the case expects of them.

// convReadTimeout is the sidecars' --read-timeout: the stalled body's 408
// comes after it, on both paths.
const convReadTimeout = 4 * time.Second

// convCountered are the sidecar's families compared between the paths.
var convCountered = []string{
	"pd_sidecar_requests_total", "pd_sidecar_requests_rejected_total", "pd_sidecar_client_disconnects_total",
	"pd_sidecar_inflight_requests",
}

// convAnswer is what a client saw of one answer.
type convAnswer struct {
	status  int    // 0: none came
	proto   string // the status line's
	framing string // "length", "chunked" or "close" (the body ends with the connection)
	conn    string // what the answer says of the connection: "close" or "keep-alive"
	body    string // answerOf the body
}

// convOutcome is what a client, the sidecar's counters and the engine saw
// of one case.
type convOutcome struct {
	answers []convAnswer
	closed  bool          // the sidecar closed the connection after the answers
	took    time.Duration // from the last write to the last answer
	counts  []string
	engine  []string // "METHOD target" of each request the engine got
}

// convExchange is one request: the parts the client writes (a write each,
// 50 ms apart), then an answer read (within wait).
type convExchange struct {
	parts []string
	wait  time.Duration
}

// convCase is one conformance case.
type convCase struct {
	name      string
	exchanges []convExchange
	halfClose bool // shut the client's side once the last request is written
	// engineVaries: whether the engine saw the request depends on timing
	// (a half-closed client's request may be sent before the sidecar sees
	// the FIN): not compared.
	engineVaries bool
	check        func(t *testing.T, o convOutcome)
}

// rawHead is a request head with a Content-Length body of n bytes.
func rawHead(method, target, proto, host string, n int, extra ...string) string {
	return fmt.Sprintf("%s %s %s\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n",
		method, target, proto, host, n, strings.Join(extra, ""))
}

// rawPost is a whole POST of body.
func rawPost(target, proto, body string, extra ...string) string {
	return rawHead("POST", target, proto, "x", len(body), extra...) + body
}

// runConv runs c's exchanges on a connection of its own to sc.
func runConv(t *testing.T, sc *harness.Sidecar, engine *harness.Engine, c convCase) convOutcome {
	t.Helper()
	// An exchange's time runs from before any timer of the sidecar's for it
	// can start: the dial, then each exchange's first write.
	sent := time.Now()
	conn, err := net.Dial("tcp", harness.HostPort(sc.Port))
	require.NoError(t, err)
	defer conn.Close()
	br := bufio.NewReader(conn)
	var o convOutcome
	for i, ex := range c.exchanges {
		if i > 0 {
			sent = time.Now()
		}
		resume := func() {}
		if i == len(c.exchanges)-1 && c.halfClose {
			// The engine is stopped from before the request until the
			// sidecar's kernel has the client's FIN (closeWriteAcked): the
			// answer cannot come before the FIN, however long this
			// goroutine waits between its writes or loopback takes.
			require.NoError(t, engine.Signal(syscall.SIGSTOP))
			resume = sync.OnceFunc(func() { require.NoError(t, engine.Signal(syscall.SIGCONT)) })
			defer resume()
		}
		for j, part := range ex.parts {
			if j > 0 {
				time.Sleep(50 * time.Millisecond)
			}
			_, err := io.WriteString(conn, part)
			require.NoError(t, err)
		}
		if i == len(c.exchanges)-1 && c.halfClose {
			closeWriteAcked(t, conn.(*net.TCPConn))
			resume()
		}
		wait := ex.wait
		if wait == 0 {
			wait = 30 * time.Second
		}
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(wait)))
		if _, err := br.Peek(1); err != nil {
			require.ErrorIs(t, err, io.EOF, "an answer or a close within %v", wait)
			o.answers, o.closed = append(o.answers, convAnswer{}), true
			break
		}
		method := strings.Fields(ex.parts[0])[0]
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		o.took = time.Since(sent)
		a := convAnswer{status: resp.StatusCode, proto: resp.Proto, conn: "keep-alive", body: answerOf(b)}
		if resp.Close {
			a.conn = "close"
		}
		switch {
		case len(resp.TransferEncoding) > 0:
			a.framing = "chunked"
		case resp.ContentLength >= 0:
			a.framing = "length"
		default:
			a.framing = "close"
			o.closed = true
		}
		o.answers = append(o.answers, a)
	}
	if !o.closed {
		// An answer that says Connection: close is followed by the close,
		// however late it comes; after a keep-alive answer the connection
		// must stay open (a close within 300 ms is caught).
		wait := 300 * time.Millisecond
		if n := len(o.answers); n > 0 && o.answers[n-1].conn == "close" {
			wait = 30 * time.Second
		}
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(wait)))
		_, err := br.Peek(1)
		var ne net.Error
		switch {
		case errors.Is(err, io.EOF):
			o.closed = true
		case errors.As(err, &ne) && ne.Timeout():
		default:
			rest, _ := br.Peek(br.Buffered())
			t.Fatalf("bytes after the answers: %q (%v)", rest, err)
		}
	}
	conn.Close()
	harness.Eventually(t, 30*time.Second, "the request ended", func() bool {
		return sc.Metric(t, "pd_sidecar_inflight_requests", nil) == 0
	})
	o.counts = series(harness.Scrape(t, sc.URL()+"/metrics"), convCountered)
	for _, r := range journal(t, engine) {
		o.engine = append(o.engine, r.Method+" "+r.Target)
	}
	return o
}

// counted reads one series of o's counts ("name{labels}"), 0 when absent.
func (o convOutcome) counted(series string) string {
	for _, s := range o.counts {
		if v, ok := strings.CutPrefix(s, series+" "); ok {
			return v
		}
	}
	return "0"
}

// forget clears e's request journal.
func forget(t *testing.T, e *harness.Engine) {
	t.Helper()
	req, err := http.NewRequest(http.MethodDelete, e.URL()+"/sim/requests", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
}

// refusedBy returns a check: the request was answered status with a JSON
// error, counted as refused for reason, the connection closed after it,
// and it reached no engine.
func refusedBy(status int, reason string) func(*testing.T, convOutcome) {
	return func(t *testing.T, o convOutcome) {
		require.Len(t, o.answers, 1)
		a := o.answers[0]
		assert.Equal(t, status, a.status)
		assert.True(t, strings.HasPrefix(a.body, fmt.Sprintf("error %d ", status)), "an OpenAI-style error: %s", a.body)
		assert.Equal(t, "close", a.conn)
		assert.True(t, o.closed, "the connection closes after it")
		assert.Equal(t, "1", o.counted(`pd_sidecar_requests_rejected_total{reason=`+reason+`}`), "%v", o.counts)
		assert.Empty(t, o.engine, "no engine saw it")
	}
}

func TestConformanceBothPaths(t *testing.T) {
	// A half-closed client's FIN comes before its answer: the engine is
	// stopped until it was sent (runConv).
	engine := harness.StartEngineSim(t, "decode")
	body := completionBody(`,"max_tokens":3`)
	stream := completionBody(`,"max_tokens":3,"stream":true`)
	// The answers to an HTTP/1.0 client say HTTP/1.1, the sidecar's
	// version, in a framing it reads.
	streamed := func() func(*testing.T, convOutcome) {
		return func(t *testing.T, o convOutcome) {
			require.Len(t, o.answers, 1)
			a := o.answers[0]
			assert.Equal(t, http.StatusOK, a.status)
			assert.Equal(t, "HTTP/1.1", a.proto)
			assert.Equal(t, "close", a.framing, "an HTTP/1.0 client cannot read chunked framing")
			assert.True(t, strings.HasSuffix(a.body, "[DONE]"), "the whole stream: %s", a.body)
			assert.True(t, o.closed)
			assert.Equal(t, "1", o.counted(`pd_sidecar_requests_total{code=200,mode=local}`), "%v", o.counts)
		}
	}
	pathCase := func(target string) convCase {
		return convCase{name: "target " + target, exchanges: []convExchange{{parts: []string{rawPost(target, "HTTP/1.1", body)}}},
			check: refusedBy(http.StatusBadRequest, "path_not_normal")}
	}
	cases := []convCase{
		{name: "half-close after a request", exchanges: []convExchange{{parts: []string{rawPost("/v1/completions", "HTTP/1.1", body)}}},
			halfClose: true, engineVaries: true, check: func(t *testing.T, o convOutcome) {
				assert.Equal(t, []convAnswer{{}}, o.answers, "nothing is written")
				assert.True(t, o.closed)
				assert.Equal(t, "1", o.counted(`pd_sidecar_requests_total{code=499,mode=local}`), "%v", o.counts)
				assert.Equal(t, "1", o.counted(`pd_sidecar_client_disconnects_total{phase=local}`), "%v", o.counts)
			}},
		{name: "half-close after a streamed request", exchanges: []convExchange{{parts: []string{rawPost("/v1/completions", "HTTP/1.1", stream)}}},
			halfClose: true, engineVaries: true, check: func(t *testing.T, o convOutcome) {
				assert.Equal(t, []convAnswer{{}}, o.answers, "nothing is written")
				assert.Equal(t, "1", o.counted(`pd_sidecar_requests_total{code=499,mode=local}`), "%v", o.counts)
			}},
		{name: "half-close after a passthrough request", exchanges: []convExchange{{parts: []string{"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"}}},
			halfClose: true, engineVaries: true, check: func(t *testing.T, o convOutcome) {
				assert.Equal(t, []convAnswer{{}}, o.answers, "nothing is written, not even an error")
				assert.True(t, o.closed)
				assert.Equal(t, "1", o.counted(`pd_sidecar_client_disconnects_total{phase=passthrough}`), "%v", o.counts)
			}},
		{name: "a short body that stalls", exchanges: []convExchange{{
			parts: []string{rawHead("POST", "/v1/completions", "HTTP/1.1", "x", len(body)) + body[:len(body)/2]},
			wait:  2*convReadTimeout + 5*time.Second}},
			check: func(t *testing.T, o convOutcome) {
				refusedBy(http.StatusRequestTimeout, "read_timeout")(t, o)
				assert.GreaterOrEqual(t, o.took, convReadTimeout, "--read-timeout")
				// One timeout for head and body, not one each (twice it).
				assert.Less(t, o.took, convReadTimeout*7/4, "--read-timeout, head and body: not more")
			}},
		{name: "a Host with a path", exchanges: []convExchange{{parts: []string{rawHead("POST", "/v1/completions", "HTTP/1.1", "evil.example:80/path", len(body)) + body}}},
			check: refusedBy(http.StatusBadRequest, "malformed")},
		{name: "HTTP/2.0 in a request line", exchanges: []convExchange{{parts: []string{rawPost("/v1/completions", "HTTP/2.0", body)}}},
			check: refusedBy(http.StatusHTTPVersionNotSupported, "http_version")},
		{name: "HTTP/1.2", exchanges: []convExchange{{parts: []string{rawPost("/v1/completions", "HTTP/1.2", body)}}},
			check: refusedBy(http.StatusHTTPVersionNotSupported, "http_version")},
		{name: "HTTP/0.9 passthrough", exchanges: []convExchange{{parts: []string{"GET /v1/models HTTP/0.9\r\nHost: x\r\n\r\n"}}},
			check: refusedBy(http.StatusHTTPVersionNotSupported, "http_version")},
		{name: "HTTP/1.0 stream", exchanges: []convExchange{{parts: []string{rawPost("/v1/completions", "HTTP/1.0", stream)}}},
			check: streamed()},
		{name: "HTTP/1.0 stream, keep-alive asked", exchanges: []convExchange{{parts: []string{rawPost("/v1/completions", "HTTP/1.0", stream, "Connection: keep-alive\r\n")}}},
			check: streamed()},
		{name: "HTTP/1.0 JSON", exchanges: []convExchange{{parts: []string{rawPost("/v1/completions", "HTTP/1.0", body)}}},
			check: func(t *testing.T, o convOutcome) {
				require.Len(t, o.answers, 1)
				assert.Equal(t, convAnswer{status: 200, proto: "HTTP/1.1", framing: "length", conn: "close", body: o.answers[0].body}, o.answers[0])
				assert.NotEmpty(t, o.answers[0].body)
				assert.True(t, o.closed, "no keep-alive asked")
			}},
		{name: "HTTP/1.0 JSON, keep-alive", exchanges: []convExchange{
			{parts: []string{rawPost("/v1/completions", "HTTP/1.0", body, "Connection: keep-alive\r\n")}},
			{parts: []string{rawPost("/v1/completions", "HTTP/1.0", body, "Connection: keep-alive\r\n")}}},
			check: func(t *testing.T, o convOutcome) {
				require.Len(t, o.answers, 2)
				for _, a := range o.answers {
					assert.Equal(t, convAnswer{status: 200, proto: "HTTP/1.1", framing: "length", conn: "keep-alive", body: a.body}, a)
				}
				assert.False(t, o.closed, "kept alive, as asked")
				assert.Equal(t, []string{"POST /v1/completions", "POST /v1/completions"}, o.engine)
			}},
		pathCase("/v1/../v1/completions"),
		pathCase("/v1/%2e%2e/v1/completions"),
		pathCase("/v1/%63ompletions"),
		pathCase("//v1/completions"),
		pathCase("/v1/./completions"),
		pathCase("/v1/completions%2F"),
		pathCase("/v1/completions#top"),
		{name: "target /health/../v1/models", exchanges: []convExchange{{parts: []string{"GET /health/../v1/models HTTP/1.1\r\nHost: x\r\n\r\n"}}},
			check: refusedBy(http.StatusBadRequest, "path_not_normal")},
		{name: "an absolute-form target", exchanges: []convExchange{{parts: []string{rawPost("http://engine.example/v1/completions?x=1", "HTTP/1.1", body)}}},
			check: func(t *testing.T, o convOutcome) {
				require.Len(t, o.answers, 1)
				assert.Equal(t, http.StatusOK, o.answers[0].status)
				assert.Equal(t, []string{"POST /v1/completions?x=1"}, o.engine, "the path routed on, in origin form")
			}},
		{name: "a query is forwarded as sent", exchanges: []convExchange{{parts: []string{rawPost("/v1/completions?a=../b", "HTTP/1.1", body)}}},
			check: func(t *testing.T, o convOutcome) {
				require.Len(t, o.answers, 1)
				assert.Equal(t, http.StatusOK, o.answers[0].status)
				assert.Equal(t, []string{"POST /v1/completions?a=../b"}, o.engine)
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			flags := []string{"--read-timeout", convReadTimeout.String()}
			var outs [2]convOutcome
			for i, extra := range [][]string{nil, {"--stream-loops=0"}} {
				sc := harness.StartSidecar(t, engine.Port, append(flags, extra...)...)
				forget(t, engine)
				outs[i] = runConv(t, sc, engine, c)
			}
			lane, plain := outs[0], outs[1]
			assert.Equal(t, plain.answers, lane.answers, "the answers")
			assert.Equal(t, plain.closed, lane.closed, "the connection's end")
			assert.Equal(t, plain.counts, lane.counts, "the counters")
			if !c.engineVaries {
				assert.Equal(t, plain.engine, lane.engine, "what the engine got")
			}
			if c.exchanges[0].wait > 0 {
				d := lane.took - plain.took
				assert.Less(t, d.Abs(), convReadTimeout*3/4, "the lane %v, fasthttp's path %v", lane.took, plain.took)
			}
			for i, o := range outs {
				t.Run([]string{"lane", "stream-loops=0"}[i], func(t *testing.T) { c.check(t, o) })
			}
		})
	}
}
