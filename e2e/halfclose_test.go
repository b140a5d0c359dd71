package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestClientLeftIsNeverAnswered: a client that sent its request and then
// closed its side of the connection before the answer (shutdown(SHUT_WR)
// here, which the sidecar cannot tell from a close: both are a FIN) is
// taken as gone on both paths, as nginx takes it (proxy_ignore_client_abort
// off): the engine's request (2 s of prefill) is cancelled, it counts
// 499, and nothing is written before the connection closes — fasthttp's
// path used to write its untouched response, an empty 200, a cancelled
// request reported as success. A client that resets is gone as well. On
// the lane (the request whole in one write) and on fasthttp's path (the
// head in two writes).
func TestClientLeftIsNeverAnswered(t *testing.T) {
	// ~2 s of prefill for the prompt: the sidecar has seen the FIN (or the
	// reset) long before the engine could finish, on any machine.
	decode := harness.StartEngineSim(t, "decode", "--prefill-us-per-token", "50000")
	sc := harness.StartSidecar(t, decode.Port)
	body := completionBody(`,"max_tokens":8`)
	leaves := []struct {
		name  string
		leave func(*net.TCPConn) error
	}{
		{"half-close", func(c *net.TCPConn) error { closeWriteAcked(t, c); return nil }},
		{"reset", func(c *net.TCPConn) error {
			// Before the sidecar could answer: only a close is seen.
			if err := c.SetLinger(0); err != nil {
				return err
			}
			return c.Close()
		}},
	}
	n := 0.0
	for _, l := range leaves {
		for _, whole := range []bool{true, false} {
			conn := postRaw(t, sc.Port, "/v1/completions", body, nil, whole)
			require.NoError(t, l.leave(conn.(*net.TCPConn)))
			n++
			if l.name == "half-close" {
				require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
				b, err := io.ReadAll(bufio.NewReader(conn))
				require.NoError(t, err, "%s, whole: %v: the connection closes", l.name, whole)
				assert.Empty(t, string(b), "%s, whole: %v: nothing is answered", l.name, whole)
			}
			harness.Eventually(t, 30*time.Second, "counted 499", func() bool {
				return sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"code": "499"}) == n &&
					sc.Metric(t, "pd_sidecar_client_disconnects_total", map[string]string{"phase": "local"}) == n
			})
			harness.Eventually(t, 30*time.Second, "the engine is idle", func() bool { return running(t, decode) == 0 })
			assert.Zero(t, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"code": "200"}), "%s, whole: %v", l.name, whole)
		}
	}
	assert.Zero(t, decode.Metric(t, "vllm:request_success_total", nil), "the engine finished none")
	st, b, _ := scPost(t, sc.URL()+"/v1/completions", body, nil)
	assert.Equal(t, http.StatusOK, st, "%s", b)
}
