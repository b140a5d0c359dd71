package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// Answers the sidecar reads whole draw from --max-buffered-bytes as
// request bodies do: a hostile upstream that announces a large answer and
// then stalls holds its share until the exchange ends, and the answers
// that do not fit are refused before they are read. Without it, every
// concurrent request held up to --max-upstream-answer-bytes and nothing
// bounded the sum.

const (
	answerBudget  = 8 << 20
	stalledAnswer = 3 << 20
	stalledN      = 6
	admittedN     = answerBudget / stalledAnswer // 2
)

// stallingAnswer announces a JSON answer of stalledAnswer bytes, sends its
// first bytes and nothing more.
var stallingAnswer = hostileScript{
	bad:  fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"id\":\"", stalledAnswer),
	hang: true,
}

// budgetFlags keep the budget small, every request meeting its prefiller.
var budgetFlags = []string{"--max-buffered-bytes", itoa(answerBudget), "--max-request-body-bytes", itoa(1 << 20),
	"--prefill-max-retries", "0", "--circuit-breaker-failures", "0", "--log-level", "info"}

// sendOn writes a request on a new connection: whole in one write (the
// lane's) or its head in two writes (fasthttp's path).
func sendOn(t *testing.T, port int, path, body string, headers map[string]string, whole bool) (net.Conn, *bufio.Reader) {
	t.Helper()
	c := postRaw(t, port, path, body, headers, whole)
	return c, bufio.NewReader(c)
}

type budgetAnswer struct {
	status     int
	body       []byte
	retryAfter string
	took       time.Duration
}

func readAnswerOn(c net.Conn, br *bufio.Reader, d time.Duration) (budgetAnswer, error) {
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(d))
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodPost})
	if err != nil {
		return budgetAnswer{}, err
	}
	b, err := io.ReadAll(resp.Body)
	return budgetAnswer{status: resp.StatusCode, body: b, retryAfter: resp.Header.Get("Retry-After"), took: time.Since(start)}, err
}

// TestAnswerBudgetPrefiller: a prefiller announces 3 MiB answers and
// stalls; of 6 concurrent requests, the 2 whose answers fit in the 8 MiB
// budget wait for --prefill-timeout, the others fall back to local prefill
// at once (fallbacks_total{reason="buffered_bytes"}); every client gets
// its local answer, and the budget is all given back.
func TestAnswerBudgetPrefiller(t *testing.T) {
	body := completionBody(`,"max_tokens":4`)
	for _, whole := range []bool{true, false} {
		t.Run(map[bool]string{true: "lane", false: "fasthttp"}[whole], func(t *testing.T) {
			h := startHostile(t, stallingAnswer)
			decode := harness.StartEngineSim(t, "decode")
			sc := harness.StartSidecar(t, decode.Port, budgetFlags...)
			hdr := map[string]string{"x-prefiller-host-port": h.Addr()}
			answers := make([]budgetAnswer, stalledN)
			var wg sync.WaitGroup
			for i := range stalledN {
				c, br := sendOn(t, sc.Port, "/v1/completions", body, hdr, whole)
				defer c.Close()
				wg.Go(func() {
					a, err := readAnswerOn(c, br, 60*time.Second) // --prefill-timeout 2s, then a local prefill
					assert.NoError(t, err, "a well-framed answer in time")
					answers[i] = a
				})
			}
			fallback := func(reason string) float64 {
				return sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": reason})
			}
			harness.Eventually(t, 30*time.Second, "the answers past the budget refused", func() bool {
				return fallback("buffered_bytes") == stalledN-admittedN
			})
			assert.Equal(t, float64(admittedN*stalledAnswer), sc.Metric(t, "pd_sidecar_buffered_bytes", nil),
				"the stalled answers that fit hold their announced length")
			wg.Wait()
			for i, a := range answers {
				assert.Equal(t, http.StatusOK, a.status, "request %d: %s", i, a.body)
				assert.NotEmpty(t, textOf(a.body), "request %d: a local answer: %s", i, a.body)
			}
			assert.Equal(t, float64(stalledN-admittedN), fallback("buffered_bytes"))
			assert.Equal(t, float64(admittedN), fallback("timeout"), "the admitted ones waited for --prefill-timeout")
			harness.Eventually(t, 30*time.Second, "the budget given back", func() bool {
				return sc.Metric(t, "pd_sidecar_buffered_bytes", nil) == 0
			})
			alive(t, sc)
		})
	}
}

// TestAnswerBudgetEngine: the local engine announces 3 MiB answers and
// stalls; of 6 concurrent requests, the 2 whose answers fit wait, the
// others are refused at once, 503 JSON with Retry-After, counted as a
// request body refused by the budget is. When the waiting clients leave,
// the budget is all given back.
func TestAnswerBudgetEngine(t *testing.T) {
	body := completionBody(`,"max_tokens":4`)
	for _, whole := range []bool{true, false} {
		t.Run(map[bool]string{true: "lane", false: "fasthttp"}[whole], func(t *testing.T) {
			h := startHostile(t, stallingAnswer)
			sc := harness.StartSidecar(t, h.Port(), budgetFlags...)
			type sent struct {
				c  net.Conn
				br *bufio.Reader
			}
			type answered struct {
				i int
				a budgetAnswer
			}
			var reqs []sent
			answers := make(chan answered, stalledN)
			for i := range stalledN {
				c, br := sendOn(t, sc.Port, "/v1/completions", body, nil, whole)
				defer c.Close()
				reqs = append(reqs, sent{c, br})
				go func() {
					// The engine stalls: only a refusal answers, until the
					// test closes the waiting connections.
					a, err := readAnswerOn(c, br, time.Minute)
					if err == nil {
						answers <- answered{i, a}
					}
				}()
			}
			// Every refusal is counted, and the answers that fit hold their
			// share, before the refused ones are read.
			harness.Eventually(t, 30*time.Second, "the answers past the budget refused and the others admitted", func() bool {
				m := harness.Scrape(t, sc.URL()+"/metrics")
				return m.Value("pd_sidecar_requests_rejected_total", map[string]string{"reason": "buffered_bytes"}) >= stalledN-admittedN &&
					m.Value("pd_sidecar_buffered_bytes", nil) >= admittedN*stalledAnswer
			})
			refusedIdx := map[int]bool{}
			for range stalledN - admittedN {
				select {
				case r := <-answers:
					refusedIdx[r.i] = true
					if assert.Equal(t, http.StatusServiceUnavailable, r.a.status, "request %d: %s", r.i, r.a.body) {
						assert.Equal(t, "1", r.a.retryAfter)
						assert.Equal(t, int64(503), gjson.GetBytes(r.a.body, "error.code").Int(), "a JSON error: %s", r.a.body)
						assert.Contains(t, gjson.GetBytes(r.a.body, "error.message").String(), "--max-buffered-bytes")
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("%d of %d refusals answered", len(refusedIdx), stalledN-admittedN)
				}
			}
			var refused, waiting []net.Conn
			for i, s := range reqs {
				if refusedIdx[i] {
					refused = append(refused, s.c)
				} else {
					waiting = append(waiting, s.c) // no answer: its answer fit, and stalls
				}
			}
			select {
			case r := <-answers:
				t.Errorf("request %d answered while its engine stalls: %d %s", r.i, r.a.status, r.a.body)
			default:
			}
			assert.Len(t, waiting, admittedN, "the answers that fit are waited for")
			assert.Len(t, refused, stalledN-admittedN)
			m := harness.Scrape(t, sc.URL()+"/metrics")
			assert.Equal(t, float64(stalledN-admittedN), m.Value("pd_sidecar_requests_rejected_total", map[string]string{"reason": "buffered_bytes"}))
			assert.Equal(t, float64(stalledN-admittedN), m.Value("pd_sidecar_requests_total", map[string]string{"code": "503"}))
			assert.Equal(t, float64(admittedN*stalledAnswer), m.Value("pd_sidecar_buffered_bytes", nil))
			for _, c := range waiting {
				_ = c.Close()
			}
			harness.Eventually(t, 30*time.Second, "the budget given back", func() bool {
				return sc.Metric(t, "pd_sidecar_buffered_bytes", nil) == 0
			})
			alive(t, sc)
		})
	}
}
