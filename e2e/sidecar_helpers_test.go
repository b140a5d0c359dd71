package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// pdRig is a prefill engine, a decode engine and a sidecar in front of the
// decode engine, all real processes on loopback.
type pdRig struct {
	prefill, decode *harness.Engine
	sc              *harness.Sidecar
}

// newRig starts the three processes; flags go to the sidecar.
func newRig(t *testing.T, flags ...string) *pdRig {
	t.Helper()
	r := &pdRig{
		prefill: harness.StartEngineSim(t, "prefill"),
		decode:  harness.StartEngineSim(t, "decode"),
	}
	r.sc = harness.StartSidecar(t, r.decode.Port, flags...)
	return r
}

// header names the rig's prefiller.
func (r *pdRig) header() map[string]string {
	return map[string]string{"x-prefiller-host-port": r.prefill.HostPort()}
}

// scMetric reads one sidecar metric.
func (r *pdRig) scMetric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return r.sc.Metric(t, name, labels)
}

// scPost posts body to url with headers and returns status, body and
// response headers.
func scPost(t *testing.T, url, body string, headers map[string]string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b, resp.Header
}

// scStream posts a streaming request and returns the status, the generated
// text (completion text or chat content deltas, concatenated) and every
// data payload.
func scStream(t *testing.T, url, body string, headers map[string]string) (int, string, []string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var text strings.Builder
	var events []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		events = append(events, data)
		text.WriteString(gjson.Get(data, "choices.0.text").String())
		text.WriteString(gjson.Get(data, "choices.0.delta.content").String())
	}
	require.NoError(t, sc.Err())
	return resp.StatusCode, text.String(), events
}

// textOf extracts the generated output of a JSON answer of any API.
func textOf(answer []byte) string {
	for _, p := range []string{"choices.0.text", "choices.0.message.content", "output.0.content.0.text", "content.0.text", "choices.0.token_ids"} {
		if v := gjson.GetBytes(answer, p); v.Exists() {
			return v.Raw
		}
	}
	return ""
}

// setFault installs a fault on an engine-sim (see its /sim/faults).
func setFault(t *testing.T, e *harness.Engine, fault string) {
	t.Helper()
	resp, err := http.Post(e.URL()+"/sim/faults", "application/json", strings.NewReader(fault))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "set fault %s", fault)
}

// simRequest is one entry of engine-sim's /sim/requests journal.
type simRequest struct {
	Method  string              `json:"method"`
	Path    string              `json:"path"`
	Target  string              `json:"target"` // as on the request line
	Headers map[string][]string `json:"headers"`
	Body    json.RawMessage     `json:"body"`
}

// simRequests returns the inference requests an engine received.
func simRequests(t *testing.T, e *harness.Engine) []simRequest {
	t.Helper()
	var inf []simRequest
	for _, r := range journal(t, e) {
		if strings.HasPrefix(r.Path, "/v1/") && r.Path != "/v1/models" || strings.HasPrefix(r.Path, "/inference/") {
			inf = append(inf, r)
		}
	}
	return inf
}

// journal is every request an engine received (passthrough ones too).
func journal(t *testing.T, e *harness.Engine) []simRequest {
	t.Helper()
	resp, err := http.Get(e.URL() + "/sim/requests")
	require.NoError(t, err)
	defer resp.Body.Close()
	var out []simRequest
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return out
}

func completionBody(extra string) string {
	return `{"model":"sim-model","prompt":` + quote(simPrompt) + extra + `}`
}

// running reads vllm:num_requests_running.
func running(t *testing.T, e *harness.Engine) float64 {
	t.Helper()
	return e.Metric(t, "vllm:num_requests_running", nil)
}

// openStream starts a streaming request and returns its body after the
// first n data events were read, and a cancel that drops the connection.
func openStream(t *testing.T, url, body string, headers map[string]string, n int) (*bufio.Reader, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(body)))
	require.NoError(t, err)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	for seen := 0; seen < n; {
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		if strings.HasPrefix(line, "data: ") {
			seen++
		}
	}
	return br, cancel
}

// postSplit posts body to path on port from a connection of its own, the
// head cut across two writes: such a request is never the lane's (it takes
// only a request whose head came whole in its first read), so fasthttp
// serves it, and a stream of it is handed over to a loop after 50 ms.
func postSplit(t *testing.T, port int, path, body string, headers map[string]string) (*http.Response, net.Conn) {
	t.Helper()
	conn := postRaw(t, port, path, body, headers, false)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	return resp, conn
}

// exchangeRaw posts body as postRaw does and reads the whole answer
// (within 10 s).
func exchangeRaw(t *testing.T, port int, path, body string, headers map[string]string, whole bool) (*http.Response, []byte) {
	t.Helper()
	conn := postRaw(t, port, path, body, headers, whole)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// postRaw dials the sidecar on port and writes a POST of body (see
// writeRequest).
func postRaw(t *testing.T, port int, path, body string, headers map[string]string, whole bool) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", harness.HostPort(port))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	writeRequest(t, conn, path, body, headers, whole)
	return conn
}

// requestHead is the head of a JSON POST to path with a body of n bytes
// and extra headers.
func requestHead(path string, n int, headers map[string]string) string {
	var head strings.Builder
	fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, n)
	for k, v := range headers {
		fmt.Fprintf(&head, "%s: %s\r\n", k, v)
	}
	return head.String() + "\r\n"
}

// writeRequest writes a POST of body to conn: whole in one write (a
// request the lane serves) or its head cut across two writes (one fasthttp
// serves: the lane takes a request only when its head came whole in the
// loop's first read; a body that comes after the head is still the lane's).
func writeRequest(t *testing.T, conn net.Conn, path, body string, headers map[string]string, whole bool) {
	t.Helper()
	h := requestHead(path, len(body), headers)
	if whole {
		_, err := io.WriteString(conn, h+body)
		require.NoError(t, err)
		return
	}
	_, err := io.WriteString(conn, h[:len(h)/2])
	require.NoError(t, err)
	// The sidecar has read the first half alone before the rest is sent (a
	// read that found the whole head would give the request to the lane).
	harness.WaitPeerRead(t, conn, 30*time.Second)
	_, err = io.WriteString(conn, h[len(h)/2:]+body)
	require.NoError(t, err)
}

// within asserts that f finishes within d and returns how long it took.
func within(t *testing.T, d time.Duration, f func()) time.Duration {
	t.Helper()
	start := time.Now()
	f()
	took := time.Since(start)
	require.LessOrEqual(t, took, d, "took %v", took)
	return took
}

func jsonDecode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }

func itoa(i int) string { return strconv.Itoa(i) }
