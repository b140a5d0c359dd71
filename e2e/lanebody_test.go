package e2e

import (
	"bufio"
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

// longPrompt is a chat body with a prompt of words words (~7 bytes each).
func longPrompt(words int, extra string) string {
	var b strings.Builder
	for i := range words {
		fmt.Fprintf(&b, "w%d ", i%997)
	}
	return `{"model":"sim-model","messages":[{"role":"user","content":` + quote(b.String()) + `}]` + extra + `}`
}

// TestLaneLongBodies: a request whose body is longer than the loop's one
// read (a long prompt, sent in one write) is read and served whole on the
// lane (proxy/lane), local and P/D, with the answer the engine gives
// directly and every prompt token reaching it; its buffered bytes are
// given back after it. So is a short body the client writes after its head
// (as Go's HTTP client writes a body past its 4 KiB buffer). A client that
// leaves mid-body gives its reservation back too; one that stalls mid-body
// is handed to fasthttp, which reads the rest and answers.
func TestLaneLongBodies(t *testing.T) {
	const readTimeout = 6 * time.Second
	rig := newRig(t, "--read-timeout", readTimeout.String())
	body := longPrompt(30000, `,"max_tokens":4`)
	require.Greater(t, len(body), 100<<10)
	_, direct, _ := scPost(t, rig.decode.URL()+"/v1/chat/completions", body, nil)
	want := gjson.GetBytes(direct, "usage.prompt_tokens").Int()
	require.Greater(t, want, int64(30000))

	for i, pd := range []bool{false, true} {
		var hdr map[string]string
		if pd {
			hdr = rig.header()
		}
		resp, b := exchangeRaw(t, rig.sc.Port, "/v1/chat/completions", body, hdr, true)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		assert.Equal(t, want, gjson.GetBytes(b, "usage.prompt_tokens").Int(), "pd %v: every prompt token reached the engine", pd)
		if !pd {
			assert.Equal(t, textOf(direct), textOf(b), "the engine's own answer")
		}
		assert.Equal(t, float64(i+1), rig.scMetric(t, laneRequests, nil), "pd %v: served on the lane", pd)
	}
	assert.Equal(t, 1.0, rig.prefill.Metric(t, "vllm:request_success_total", nil), "the P/D one was prefilled remotely")
	assert.Zero(t, rig.scMetric(t, "pd_sidecar_buffered_bytes", nil), "given back")

	// The connection a long body came on takes its next request at once:
	// the socket's low-water mark, raised while the body was awaited, is
	// back to a byte.
	kc, err := net.Dial("tcp", harness.HostPort(rig.sc.Port))
	require.NoError(t, err)
	kbr := bufio.NewReader(kc)
	for _, b := range []string{body, `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`} {
		req := requestHead("/v1/chat/completions", len(b), nil) + b
		half := len(req) // a short request in one write; a long one's body in two
		if len(b) > 1024 {
			half = len(req) - len(b) + 1024
		}
		_, err = io.WriteString(kc, req[:half])
		require.NoError(t, err)
		harness.WaitPeerRead(t, kc, 30*time.Second) // the loop read the first part and awaits the rest
		_, err = io.WriteString(kc, req[half:])
		require.NoError(t, err)
		require.NoError(t, kc.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(kbr, nil)
		require.NoError(t, err, "answered on the same connection")
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.NoError(t, kc.Close())
	assert.Equal(t, 4.0, rig.scMetric(t, laneRequests, nil), "both served on the lane")

	// A short body written after its head, local and P/D.
	short := longPrompt(300, `,"max_tokens":4`)
	_, directShort, _ := scPost(t, rig.decode.URL()+"/v1/chat/completions", short, nil)
	for i, pd := range []bool{false, true} {
		var hdr map[string]string
		if pd {
			hdr = rig.header()
		}
		conn, err := net.Dial("tcp", harness.HostPort(rig.sc.Port))
		require.NoError(t, err)
		_, err = io.WriteString(conn, requestHead("/v1/chat/completions", len(short), hdr))
		require.NoError(t, err)
		harness.WaitPeerRead(t, conn, 30*time.Second) // the loop read the head alone
		_, err = io.WriteString(conn, short)
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, conn.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		if !pd {
			assert.Equal(t, textOf(directShort), textOf(b), "the engine's own answer")
		}
		assert.Equal(t, float64(5+i), rig.scMetric(t, laneRequests, nil), "pd %v: served on the lane", pd)
	}
	assert.Equal(t, 2.0, rig.prefill.Metric(t, "vllm:request_success_total", nil), "the P/D one was prefilled remotely")
	assert.Zero(t, rig.scMetric(t, "pd_sidecar_buffered_bytes", nil), "given back")

	// A client that leaves mid-body.
	head := requestHead("/v1/chat/completions", len(body), nil)
	conn, err := net.Dial("tcp", harness.HostPort(rig.sc.Port))
	require.NoError(t, err)
	_, err = io.WriteString(conn, head+body[:len(body)/2])
	require.NoError(t, err)
	harness.Eventually(t, 30*time.Second, "the body reserved", func() bool {
		return rig.scMetric(t, "pd_sidecar_buffered_bytes", nil) == float64(len(body))
	})
	require.NoError(t, conn.Close())
	harness.Eventually(t, 30*time.Second, "and given back", func() bool {
		return rig.scMetric(t, "pd_sidecar_buffered_bytes", nil) == 0
	})

	// A client that stalls mid-body past half of --read-timeout, then sends
	// the rest within it: fasthttp reads it and answers.
	conn, err = net.Dial("tcp", harness.HostPort(rig.sc.Port))
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, head+body[:len(body)/2])
	require.NoError(t, err)
	// The stall is paced from the configured value, 1.5 s clear of both
	// ends of its window (--read-timeout/2 to --read-timeout): no
	// machine's lateness moves it out.
	time.Sleep(readTimeout * 3 / 4)
	_, err = io.WriteString(conn, body[len(body)/2:])
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, textOf(direct), textOf(b))
	assert.Equal(t, 6.0, rig.scMetric(t, laneRequests, nil), "fasthttp's")
	harness.Eventually(t, 30*time.Second, "nothing held", func() bool {
		return rig.scMetric(t, "pd_sidecar_buffered_bytes", nil) == 0
	})

	// A client that stalls past --read-timeout in all: 408, --read-timeout
	// after its first bytes (TestConformanceBothPaths times it).
	conn2, err := net.Dial("tcp", harness.HostPort(rig.sc.Port))
	require.NoError(t, err)
	defer conn2.Close()
	_, err = io.WriteString(conn2, head+body[:len(body)/2])
	require.NoError(t, err)
	require.NoError(t, conn2.SetReadDeadline(time.Now().Add(readTimeout+30*time.Second)))
	resp, err = http.ReadResponse(bufio.NewReader(conn2), nil)
	require.NoError(t, err)
	_, _ = io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	harness.Eventually(t, 30*time.Second, "nothing held after it", func() bool {
		return rig.scMetric(t, "pd_sidecar_buffered_bytes", nil) == 0
	})
}
