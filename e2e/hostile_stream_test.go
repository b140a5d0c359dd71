package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
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

// An engine whose stream never ends its event: it answers a streamed
// request with an SSE head, maybe an event, then
// `data: {"choices":[{"text":"aaaa…` with no newline, written until the
// sidecar closes the connection (or a cap, so that a test against a
// sidecar that keeps reading ends by itself). Every stream reader of the
// sidecar, on both serving paths and under every connector, must stop at
// --max-sse-event-bytes, close the connection, answer its client with a
// well-framed answer and stay small; and a client that leaves must stop
// the read at once.

// endlessCap bounds what the endless engine writes of one answer: far
// past the bound, so a sidecar that kept reading shows it (in bytes
// written, RSS and the answer), and small enough to end soon.
const endlessCap = 320 << 20

// eventBound is --max-sse-event-bytes' default, under which these tests
// run.
const eventBound = 4 << 20

// socketSlack is what the kernel may have taken on top of what the
// sidecar read when it closed the connection: the engine's send buffer
// and the sidecar's receive buffer (loopback autotuning grows the latter
// by a few MiB).
const socketSlack = 16 << 20

// rssGrowth bounds how much the sidecar's RSS may grow while it refuses
// endless events: a few buffers of the bound; a race build's shadow memory
// makes it several times that.
func rssGrowth() int64 {
	if harness.RaceBuilt() {
		return 256 << 20
	}
	return 64 << 20
}

// endlessScript is how the endless engine answers a streamed request.
type endlessScript struct {
	chunked bool          // Transfer-Encoding: chunked, else close-delimited
	before  string        // events before the endless one ("": none, the stream begins with it)
	piece   int           // bytes per write of the endless event
	pace    time.Duration // pause between writes (0: none)
}

// endlessAnswer is one endless answer as the engine wrote it.
type endlessAnswer struct {
	written atomic.Int64  // body bytes written
	capped  atomic.Bool   // endlessCap was reached: the engine ended it
	closed  chan struct{} // the connection's read side ended: the sidecar closed it
	done    chan struct{} // the writes ended
}

// endlessEngine is a raw-TCP local engine: streamed requests get the
// script while hostile > 0, everything else a good answer (" fine").
type endlessEngine struct {
	*harness.RawServer
	answers chan *endlessAnswer
	reqs    atomic.Int64

	mu      sync.Mutex
	script  endlessScript
	hostile int
}

func startEndless(t *testing.T) *endlessEngine {
	t.Helper()
	e := &endlessEngine{answers: make(chan *endlessAnswer, 16)}
	e.RawServer = harness.StartRawServer(t, func(c net.Conn) { harness.ServeRequests(c, e.answer) })
	return e
}

// arm answers the next streamed request with s.
func (e *endlessEngine) arm(s endlessScript) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.script, e.hostile = s, 1
}

// take returns the script for a request and whether it applies.
func (e *endlessEngine) take(stream bool) (endlessScript, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !stream || e.hostile == 0 {
		return endlessScript{}, false
	}
	e.hostile--
	return e.script, true
}

// next returns the endless answer that the request just sent got.
func (e *endlessEngine) next(t *testing.T) *endlessAnswer {
	t.Helper()
	select {
	case a := <-e.answers:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("the endless engine got no streamed request")
		return nil
	}
}

const goodEvent = `data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" fine","finish_reason":null}]}` + "\n\n"

// answer writes the answer to the request just read on c, and says
// whether c serves another (not after an endless answer).
func (e *endlessEngine) answer(c net.Conn, _ *http.Request, body []byte) bool {
	e.reqs.Add(1)
	stream := gjson.GetBytes(body, "stream").Bool()
	s, hostile := e.take(stream)
	if !hostile {
		var answer string
		if stream {
			events := goodEvent + `data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"","finish_reason":"length"}]}` + "\n\ndata: [DONE]\n\n"
			answer = fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(events), events)
		} else {
			answer = jsonAnswer(200, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" fine","finish_reason":"length"}],"kv_transfer_params":null}`)
		}
		_, err := io.WriteString(c, answer)
		return err == nil
	}
	a := &endlessAnswer{closed: make(chan struct{}), done: make(chan struct{})}
	e.answers <- a
	go func() {
		// Until the sidecar closes the connection (EOF or a reset).
		_, _ = io.Copy(io.Discard, c)
		close(a.closed)
	}()
	writeEndless(c, s, a)
	return false
}

// writeEndless writes the endless answer until the sidecar closes the
// connection, or endlessCap.
func writeEndless(c net.Conn, s endlessScript, a *endlessAnswer) {
	defer close(a.done)
	head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
	if s.chunked {
		head += "Transfer-Encoding: chunked\r\n\r\n"
	} else {
		head += "Connection: close\r\n\r\n"
	}
	frame := func(b []byte) []byte {
		if !s.chunked {
			return b
		}
		return append(append(fmt.Appendf(nil, "%x\r\n", len(b)), b...), "\r\n"...)
	}
	write := func(b []byte) bool {
		_ = c.SetWriteDeadline(time.Now().Add(20 * time.Second))
		_, err := c.Write(b)
		return err == nil
	}
	open := []byte(s.before + `data: {"choices":[{"text":"`)
	if !write(append([]byte(head), frame(open)...)) {
		return
	}
	a.written.Add(int64(len(open)))
	piece := frame(bytes.Repeat([]byte("a"), s.piece))
	for a.written.Load() < endlessCap {
		if s.pace > 0 {
			time.Sleep(s.pace)
		}
		if !write(piece) {
			return
		}
		a.written.Add(int64(s.piece))
	}
	a.capped.Store(true)
}

// memKB reads VmRSS and VmHWM (the peak) of pid, in KiB.
func memKB(t *testing.T, pid int) (rss, peak int64) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss, err = strconv.ParseInt(f[1], 10, 64)
		case "VmHWM:":
			peak, err = strconv.ParseInt(f[1], 10, 64)
		}
		require.NoError(t, err)
	}
	require.NotZero(t, rss, "VmRSS of %d", pid)
	return rss, peak
}

// streamRig is a sidecar in front of the endless engine, as one serving
// path sees it.
type streamRig struct {
	engine  *endlessEngine
	prefill *harness.Engine // a split's prefiller (nil: none)
	sc      *harness.Sidecar
	hdr     map[string]string
	whole   bool // the request in one write (the lane's) or its head in two (fasthttp's)

	baseRSS, basePeak int64 // the sidecar's memory before any endless answer, KiB
}

// streamPaths are the ways a stream of the local engine reaches a client:
// the lane, fasthttp's goroutine path (whose stream moves to an event loop
// after 50 ms), fasthttp's path alone, and the P/D splits whose decode
// stream each carries (nixlv2 on the lane; sglang, a concurrent connector,
// on fasthttp's path on the default configuration) behind a real
// prefiller.
var streamPaths = []struct {
	name  string
	flags []string
	split bool
	whole bool
}{
	{name: "lane", whole: true},
	{name: "fasthttp", whole: false},
	{name: "stream-loops=0", flags: []string{"--stream-loops", "0"}, whole: true},
	{name: "nixlv2 split", split: true, whole: true},
	// The SGLang prefiller waits for a decode that never pulls its room:
	// its leg is bounded far past the time the endless event takes to
	// reach the bound on a loaded machine, so the decode's refusal, not
	// the prefill's timeout, ends the request.
	{name: "sglang split", flags: []string{"--kv-connector", "sglang", "--prefill-timeout", "60s"}, split: true, whole: true},
}

func newStreamRig(t *testing.T, flags []string, split, whole bool) *streamRig {
	t.Helper()
	r := &streamRig{engine: startEndless(t), whole: whole}
	flags = append([]string{"--circuit-breaker-failures", "0", "--prefill-max-retries", "0"}, flags...)
	if split {
		r.prefill = harness.StartEngineSim(t, "prefill")
		flags = append(flags, "--sglang-bootstrap-port", itoa(r.prefill.BootstrapPort))
		r.hdr = map[string]string{"x-prefiller-host-port": r.prefill.HostPort()}
	}
	r.sc = harness.StartSidecar(t, r.engine.Port(), flags...)
	r.baseRSS, r.basePeak = memKB(t, r.sc.Pid())
	return r
}

// refusedAndBounded checks what became of an endless answer a that the
// sidecar refused: it closed the engine's connection after reading about
// the bound, counted the refusal (the counter was before), stayed small
// and alive.
func (r *streamRig) refusedAndBounded(t *testing.T, a *endlessAnswer, before float64, what string) {
	t.Helper()
	select {
	case <-a.closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the sidecar did not close the engine's connection")
	}
	<-a.done
	assert.False(t, a.capped.Load(), "the engine wrote all %d MiB", endlessCap>>20)
	assert.Less(t, a.written.Load(), int64(eventBound+socketSlack), "the engine wrote %d MiB", a.written.Load()>>20)
	assert.Equal(t, before+1, r.refused(t), "the refusal counted")
	rss, peak := memKB(t, r.sc.Pid())
	t.Logf("%s: the engine wrote %.1f MiB; RSS %d -> %d MiB (peak %d -> %d MiB)",
		what, float64(a.written.Load())/(1<<20), r.baseRSS>>10, rss>>10, r.basePeak>>10, peak>>10)
	grew, peakGrew := (rss-r.baseRSS)<<10, (peak-max(r.basePeak, r.baseRSS))<<10
	assert.Less(t, grew, rssGrowth(), "RSS grew by %d MiB", grew>>20)
	assert.Less(t, peakGrew, rssGrowth(), "the peak RSS grew by %d MiB", peakGrew>>20)
	alive(t, r.sc)
}

// fine requires a good answer to a streamed request (the endless
// engine's once disarmed, relayed whole).
func fine(t *testing.T, resp *http.Response, what string) {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %.300s", what, body)
	assert.Contains(t, string(body), " fine", what)
	assert.True(t, strings.HasSuffix(string(body), "data: [DONE]\n\n"), "%s: %.300s", what, body)
	assert.NotContains(t, string(body), "aaaa", what)
}

// send sends a streamed completion on a new connection and returns the
// connection and the answer, its head read.
func (r *streamRig) send(t *testing.T) (net.Conn, *http.Response) {
	t.Helper()
	conn := r.write(t)
	return conn, readHead(t, conn)
}

// write sends a streamed completion on a new connection, its answer not
// read yet.
func (r *streamRig) write(t *testing.T) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", harness.HostPort(r.sc.Port))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	writeRequest(t, conn, "/v1/completions", completionBody(`,"max_tokens":4,"stream":true`), r.hdr, r.whole)
	return conn
}

// readHead reads the head of the answer on conn (within 60 s).
func readHead(t *testing.T, conn net.Conn) *http.Response {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(60*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodPost})
	require.NoError(t, err, "an answer head")
	return resp
}

// refused is pd_sidecar_upstream_refused_total for an engine's event past
// the bound.
func (r *streamRig) refused(t *testing.T) float64 {
	t.Helper()
	return r.sc.Metric(t, "pd_sidecar_upstream_refused_total", map[string]string{"upstream": "engine", "reason": "event_too_long"})
}

// TestHostileStreamEndlessEvent: a local engine whose stream never ends an
// event (before any output, or after one), chunked or close-delimited, on
// every serving path and under the P/D splits. The sidecar reads it up to
// --max-sse-event-bytes and closes the connection; its client gets a 502
// JSON error, or the events before and an error event with [DONE]; the
// refusal is counted; RSS stays flat; the sidecar goes on serving.
func TestHostileStreamEndlessEvent(t *testing.T) {
	for _, path := range streamPaths {
		t.Run(path.name, func(t *testing.T) {
			r := newStreamRig(t, path.flags, path.split, path.whole)
			for _, tc := range []struct {
				name    string
				chunked bool
				before  string
			}{
				{name: "before any output, chunked", chunked: true},
				{name: "before any output, close-delimited"},
				{name: "after an output, chunked", chunked: true, before: goodEvent},
				{name: "after an output, close-delimited", before: goodEvent},
			} {
				t.Run(tc.name, func(t *testing.T) {
					before := r.refused(t)
					r.engine.arm(endlessScript{chunked: tc.chunked, before: tc.before, piece: 64 << 10})
					start := time.Now()
					_, resp := r.send(t)
					a := r.engine.next(t)
					body, err := io.ReadAll(resp.Body)
					require.NoError(t, err, "a well-framed answer")
					took := time.Since(start)
					assert.NotContains(t, string(body), "aaaa", "none of the endless event reaches the client")
					if tc.before == "" {
						require.Equal(t, http.StatusBadGateway, resp.StatusCode, "%.300s", body)
						assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
						assert.Equal(t, int64(502), gjson.GetBytes(body, "error.code").Int(), "an OpenAI-style error: %s", body)
						assert.Contains(t, gjson.GetBytes(body, "error.message").String(), "--max-sse-event-bytes", "%s", body)
					} else {
						require.Equal(t, http.StatusOK, resp.StatusCode, "%.300s", body)
						assert.True(t, strings.HasPrefix(string(body), goodEvent), "the event before, then the end: %.300s", body)
						rest := strings.TrimPrefix(string(body), goodEvent)
						evs := strings.Split(strings.TrimSuffix(rest, "\n\n"), "\n\n")
						require.Len(t, evs, 2, "an error event and [DONE]: %q", rest)
						errEvent := strings.TrimPrefix(evs[0], "data: ")
						assert.Equal(t, int64(502), gjson.Get(errEvent, "error.code").Int(), "an OpenAI-style error event: %q", evs[0])
						assert.Contains(t, gjson.Get(errEvent, "error.message").String(), "--max-sse-event-bytes")
						assert.Equal(t, "data: [DONE]", evs[1])
					}
					r.refusedAndBounded(t, a, before, fmt.Sprintf("%s (answered in %v)", tc.name, took.Round(time.Millisecond)))
					// The next request, on a new connection, is served.
					_, resp = r.send(t)
					fine(t, resp, "the next request")
				})
			}
			logged := 0
			for _, line := range strings.Split(r.sc.Output(), "\n") {
				if strings.Contains(line, "stream refused, upstream connection closed") {
					logged++
					assert.Contains(t, line, `"request_id":"`, "the refusal logged with the request id")
				}
			}
			assert.Equal(t, 4, logged, "each refusal logged")
		})
	}
}

// TestHostileStreamHedgedLocalLeg: a hedge's local leg (held until its
// first output, off the request's own reading, on either serving path)
// meets the endless event: the leg is refused as any stream, and the
// request goes on with the prefill it raced, answered from the decode.
func TestHostileStreamHedgedLocalLeg(t *testing.T) {
	for _, whole := range []bool{true, false} {
		name := "fasthttp"
		if whole {
			name = "lane"
		}
		t.Run(name, func(t *testing.T) {
			r := newStreamRig(t, []string{"--prefill-hedge-after", "50ms", "--prefill-hedge-budget", "1", "--prefill-timeout", "60s"}, true, whole)
			// The prefill answers once the local leg was refused, however
			// long reading it up to the bound takes on this machine.
			setFault(t, r.prefill, `{"hold_until_set":true,"only":"prefill"}`)
			before := r.refused(t)
			r.engine.arm(endlessScript{chunked: true, piece: 64 << 10})
			conn := r.write(t)    // its head waits for the decode's first output
			a := r.engine.next(t) // the local leg, at the hedge point
			r.refusedAndBounded(t, a, before, "the hedge's local leg")
			setFault(t, r.prefill, `{}`) // the prefill answers now
			fine(t, readHead(t, conn), "the decode of the prefill that was raced")
			assert.Equal(t, 1.0, r.sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
		})
	}
}

// TestHostileStreamClientLeaves: a client that leaves mid-stream while the
// engine trickles an event that never ends stops the sidecar's read at
// once, on every path: the engine sees its connection closed long before
// the bound would have closed it.
func TestHostileStreamClientLeaves(t *testing.T) {
	const piece, pace = 1 << 10, 10 * time.Millisecond // 100 KiB/s: the bound is 40 s away
	for _, path := range streamPaths {
		t.Run(path.name, func(t *testing.T) {
			r := newStreamRig(t, path.flags, path.split, path.whole)
			left := r.sc.Metric(t, "pd_sidecar_client_disconnects_total", nil)
			r.engine.arm(endlessScript{chunked: true, before: goodEvent, piece: piece, pace: pace})
			conn, resp := r.send(t)
			a := r.engine.next(t)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			// The first event, then a moment of the endless one.
			first := make([]byte, 0, len(goodEvent))
			for !bytes.Contains(first, []byte(" fine")) {
				b := make([]byte, 256)
				n, err := resp.Body.Read(b)
				first = append(first, b[:n]...)
				require.NoError(t, err, "the first event")
			}
			harness.Eventually(t, 10*time.Second, "the endless event began", func() bool { return a.written.Load() > 8*piece })
			require.NoError(t, conn.Close())
			gone := time.Now()
			select {
			case <-a.closed:
			case <-time.After(30 * time.Second): // the bound is 40 s of pacing away
				t.Fatalf("the engine's connection still open 30 s after the client left (%d KiB written)", a.written.Load()>>10)
			}
			t.Logf("the engine's connection closed %v after the client left, %d KiB written",
				time.Since(gone).Round(time.Millisecond), a.written.Load()>>10)
			assert.Less(t, a.written.Load(), int64(eventBound), "closed because the client left, not by the bound")
			harness.Eventually(t, 10*time.Second, "the client's leaving counted", func() bool {
				return r.sc.Metric(t, "pd_sidecar_client_disconnects_total", nil) == left+1
			})
			assert.Zero(t, r.refused(t), "no refusal")
			alive(t, r.sc)
		})
	}
}
