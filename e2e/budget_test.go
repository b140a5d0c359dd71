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
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestGuardBufferedBytesBudget opens many connections that each send all
// but the last byte of a large announced body, as a memory hoarder does:
// the bodies the budget admits are buffered until --read-timeout, and every
// other one is refused 503 JSON before it is read, so the sidecar's RSS
// stays under --max-buffered-bytes plus a fixed overhead (without the
// budget it grew by every body: 200 x 2 MiB). Once the hoarders leave,
// their reservations are given back and a large body is served again. Run
// with the lane (which hands a body bigger than its one read to fasthttp)
// and without it.
func TestGuardBufferedBytesBudget(t *testing.T) {
	const (
		conns   = 200
		bodyLen = 2 << 20
		budget  = 32 << 20
		admit   = budget / bodyLen
	)
	decode := harness.StartEngineSim(t, "decode")
	// Built without -race: the race detector's own memory would swamp the
	// RSS being measured.
	bin := buildNoRace(t, "pd-sidecar")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"lane", nil},
		{"stream-loops=0", []string{"--stream-loops=0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := &harness.Sidecar{Port: harness.FreePorts(t, 4)}
			sc.Proc = harness.Start(t, bin, append([]string{"--port", itoa(sc.Port), "--model-server-port", itoa(decode.Port),
				"--log-level", "error", "--max-request-body-bytes", itoa(bodyLen), "--max-buffered-bytes", itoa(budget)}, tc.args...)...)
			sc.WaitHTTP(t, sc.URL()+"/health", 30*time.Second)
			rss := func() float64 { return sc.Metric(t, "process_resident_memory_bytes", nil) }
			base := rss()

			head := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", bodyLen)
			part := []byte(head + `{"model":"sim-model","prompt":"` + strings.Repeat("x", bodyLen-32))
			var (
				mu       sync.Mutex
				refused  int
				all      []net.Conn
				answered = map[net.Conn]bool{}
				dials    sync.WaitGroup
				readers  sync.WaitGroup
			)
			for range conns {
				dials.Go(func() {
					c, err := net.Dial("tcp", harness.HostPort(sc.Port))
					if !assert.NoError(t, err) {
						return
					}
					mu.Lock()
					all = append(all, c)
					mu.Unlock()
					go func() {
						_ = c.SetWriteDeadline(time.Now().Add(time.Minute))
						_, _ = c.Write(part) // a refused one is closed under it
					}()
					readers.Go(func() {
						// A refusal is answered at once; an admitted body waits
						// for its last byte (--read-timeout, a minute) until the
						// test closes its connection.
						_ = c.SetReadDeadline(time.Now().Add(50 * time.Second))
						resp, err := http.ReadResponse(bufio.NewReader(c), nil)
						if err != nil {
							return
						}
						b, _ := io.ReadAll(resp.Body)
						_ = c.Close()
						if assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b) {
							assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
							assert.Equal(t, "1", resp.Header.Get("Retry-After"))
							assert.Equal(t, int64(503), gjson.GetBytes(b, "error.code").Int(), "%s", b)
							assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "--max-buffered-bytes")
						}
						mu.Lock()
						refused++
						answered[c] = true
						mu.Unlock()
					})
				})
			}
			dials.Wait()
			// Every body past the budget refused and answered, and the
			// admitted ones holding the whole budget: the unanswered
			// connections are the admitted bodies.
			harness.Eventually(t, time.Minute, "the bodies past the budget refused and answered, the budget held", func() bool {
				mu.Lock()
				n := refused
				mu.Unlock()
				return n == conns-admit && sc.Metric(t, "pd_sidecar_buffered_bytes", nil) == budget
			})
			var open []net.Conn
			mu.Lock()
			for _, c := range all {
				if !answered[c] {
					open = append(open, c)
				}
			}
			mu.Unlock()
			// The highest RSS over a moment is what the admitted bodies hold.
			peak := base
			for range 5 {
				peak = max(peak, rss())
				time.Sleep(100 * time.Millisecond)
			}
			m := harness.Scrape(t, sc.URL()+"/metrics")
			t.Logf("RSS %.0f MiB before, %.0f MiB with %d bodies held and %d refused (budget %d MiB)",
				base/(1<<20), peak/(1<<20), len(open), refused, budget>>20)
			assert.Equal(t, admit, len(open), "the budget admits %d bodies of %d MiB", admit, bodyLen>>20)
			assert.Equal(t, conns-admit, refused)
			assert.Equal(t, float64(conns-admit), m.Value("pd_sidecar_requests_rejected_total", map[string]string{"reason": "buffered_bytes"}))
			assert.Equal(t, float64(budget), m.Value("pd_sidecar_buffered_bytes", nil))
			assert.Less(t, peak-base, float64(budget+32<<20), "RSS stays under the budget plus a fixed overhead")

			for _, c := range open {
				_ = c.Close()
			}
			readers.Wait()
			harness.Eventually(t, 30*time.Second, "reservations given back", func() bool {
				return sc.Metric(t, "pd_sidecar_buffered_bytes", nil) == 0
			})
			pad := bodyLen - len(completionBody(`,"max_tokens":2,"pad":""`))
			big := completionBody(`,"max_tokens":2,"pad":"` + strings.Repeat("y", pad) + `"`)
			st, b, _ := scPost(t, sc.URL()+"/v1/completions", big, nil)
			assert.Equal(t, http.StatusOK, st, "%s", b)
		})
	}
}
