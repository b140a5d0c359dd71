package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// What the serving port exposes (docs/security.md, "What the serving port
// passes through"): the passthrough policy refuses, before anything is
// forwarded, what is not the engines' serving API (TRACE, CONNECT,
// OPTIONS *, the engine's admin endpoints), with an OpenAI-style 405 or
// 403, counted and logged; --metrics-port takes /metrics and /debug/pd off
// the serving port; --prefill-strip-headers keeps named client headers off
// the prefill legs. Each on the lane (default --stream-loops) and on
// fasthttp's path (--stream-loops=0).

// recordingEngine is a raw TCP local engine that records every request it
// reads and answers each with 200: a refused request must never reach it.
type recordingEngine struct {
	*harness.RawServer
	mu   sync.Mutex
	reqs []recorded
}

// recorded is one request the recording engine read.
type recorded struct {
	method, path string
}

func (r recorded) String() string { return r.method + " " + r.path }

func startRecordingEngine(t *testing.T) *recordingEngine {
	t.Helper()
	e := &recordingEngine{}
	e.RawServer = harness.StartRawServer(t, func(c net.Conn) { harness.ServeRequests(c, e.answer) })
	return e
}

// answer records the request just read on c and answers it with 200.
func (e *recordingEngine) answer(c net.Conn, req *http.Request, _ []byte) bool {
	path := req.RequestURI
	if req.URL != nil && req.URL.Path != "" {
		path = req.URL.Path
	}
	e.mu.Lock()
	e.reqs = append(e.reqs, recorded{req.Method, path})
	e.mu.Unlock()
	body := `{"engine":"fake"}`
	if path == "/metrics" {
		body = "fake_engine_metric 1\n"
	}
	head := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	if req.Method == http.MethodHead {
		body = ""
	}
	_, err := io.WriteString(c, head+body)
	return err == nil
}

// take returns the requests read so far and forgets them.
func (e *recordingEngine) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]string, 0, len(e.reqs))
	for _, r := range e.reqs {
		out = append(out, r.String())
	}
	e.reqs = nil
	return out
}

// servingPaths are the two serving paths: the lane (default --stream-loops;
// it hands every request but a POST to an inference path to fasthttp) and
// fasthttp's goroutine path alone.
var servingPaths = []struct {
	name  string
	flags []string
}{{"lane", nil}, {"stream-loops=0", []string{"--stream-loops=0"}}}

// refusal is a raw request the default policy refuses, and what the client
// must get.
type refusal struct {
	name, raw string // raw: the request; its head ends in {ID}, the request id line
	status    int
	allow     string // a 405's Allow header
}

func refusals() []refusal {
	post := func(target string) string {
		return "POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 16\r\n{ID}\r\n" + `{"method":"sir"}`
	}
	bare := func(method, target, host string) string {
		return method + " " + target + " HTTP/1.1\r\nHost: " + host + "\r\n{ID}\r\n"
	}
	return []refusal{
		{"TRACE", bare("TRACE", "/", "x"), 405, ""},
		{"TRACE on a served path", bare("TRACE", "/v1/models", "x"), 405, "GET, HEAD"},
		{"CONNECT", bare("CONNECT", "evil.example:443", "evil.example:443"), 405, ""},
		{"OPTIONS *", bare("OPTIONS", "*", "x"), 405, ""},
		{"DELETE models", bare("DELETE", "/v1/models", "x"), 405, "GET, HEAD"},
		{"GET an inference path", bare("GET", "/v1/chat/completions", "x"), 405, "POST"},
		{"POST the sidecar's /health", post("/health"), 405, "GET, HEAD"},
		{"collective_rpc", post("/collective_rpc"), 403, ""},
		{"sleep", post("/sleep?level=1"), 403, ""},
		{"wake_up", post("/wake_up"), 403, ""},
		{"is_sleeping", bare("GET", "/is_sleeping", "x"), 403, ""},
		{"reset_prefix_cache", post("/reset_prefix_cache"), 403, ""},
		{"start_profile", post("/start_profile"), 403, ""},
		{"scale_elastic_ep", post("/scale_elastic_ep"), 403, ""},
		{"pause", post("/pause"), 403, ""},
		{"load_lora_adapter", post("/v1/load_lora_adapter"), 403, ""},
		// A target not in normal form is refused before the policy is
		// asked (400, path_not_normal; docs/security.md → HTTP
		// conformance), and its connection closed.
		{"dot segments", post("/v1/../collective_rpc"), 400, ""},
		{"encoded dots", post("/v1/%2e%2e/sleep"), 400, ""},
		{"encoded letters", post("/%73leep"), 400, ""},
	}
}

// TestPassthroughPolicyRefusesBeforeForwarding: every refusal is answered
// with its status, Allow header and an OpenAI-style JSON error in fixed
// words (never the path or host it named), carries the request id, is
// counted by reason and logged with the id and path; the connection serves
// the next request, and the engine received only the allowed requests
// that followed each refusal.
func TestPassthroughPolicyRefusesBeforeForwarding(t *testing.T) {
	eng := startRecordingEngine(t)
	for _, sp := range servingPaths {
		t.Run(sp.name, func(t *testing.T) {
			sc := harness.StartSidecar(t, eng.Port(), sp.flags...)
			reason := func(r string) float64 {
				return sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": r})
			}
			methods0, paths0, normal0 := reason("method_not_allowed"), reason("path_not_allowed"), reason("path_not_normal")
			eng.take()
			var methods, paths, normal float64
			var followUps []string
			for i, rf := range refusals() {
				id := fmt.Sprintf("pt-%d", i)
				c := dialRaw(t, sc)
				c.send(strings.Replace(rf.raw, "{ID}", "X-Request-Id: "+id+"\r\n", 1))
				resp, body, raw := c.answer()
				require.Equal(t, rf.status, resp.StatusCode, "%s: %s", rf.name, raw)
				assert.Equal(t, id, resp.Header.Get("X-Request-Id"), rf.name)
				assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), rf.name)
				assert.Equal(t, int64(rf.status), gjson.GetBytes(body, "error.code").Int(), "%s: %s", rf.name, body)
				if rf.status == http.StatusMethodNotAllowed {
					methods++
					assert.Equal(t, "MethodNotAllowedError", gjson.GetBytes(body, "error.type").String(), rf.name)
					vals, ok := resp.Header["Allow"]
					require.True(t, ok, "%s: a 405 carries Allow: %s", rf.name, raw)
					assert.Equal(t, []string{rf.allow}, vals, rf.name)
				} else if rf.status == http.StatusBadRequest {
					normal++
					assert.Equal(t, "BadRequestError", gjson.GetBytes(body, "error.type").String(), rf.name)
					assert.True(t, resp.Close, "%s: Connection: close: %s", rf.name, raw)
					c = dialRaw(t, sc) // the refusal closed the connection
				} else {
					paths++
					assert.Equal(t, "PermissionDeniedError", gjson.GetBytes(body, "error.type").String(), rf.name)
				}
				for _, quoted := range []string{"evil", "sleep", "collective", "%2e", "models"} {
					assert.NotContains(t, string(body), quoted, "%s: the answer says fixed words: %s", rf.name, body)
				}
				// The connection goes on, and an allowed request passes.
				c.send("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
				resp, _, raw = c.answer()
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s, then GET /v1/models: %s", rf.name, raw)
				followUps = append(followUps, "GET /v1/models")
			}
			assert.Equal(t, followUps, eng.take(), "the engine received only the allowed requests")
			assert.Equal(t, methods, reason("method_not_allowed")-methods0)
			assert.Equal(t, paths, reason("path_not_allowed")-paths0)
			assert.Equal(t, normal, reason("path_not_normal")-normal0)
			harness.Eventually(t, 30*time.Second, "the refusal's log line", func() bool {
				for _, l := range strings.Split(sc.Output(), "\n") {
					if strings.Contains(l, `"request_id":"pt-7"`) && strings.Contains(l, `"path":"/collective_rpc"`) &&
						strings.Contains(l, `"reason":"path_not_allowed"`) && strings.Contains(l, `"status":403`) {
						return true
					}
				}
				return false
			})
		})
	}
}

// TestPassthroughPolicyPassesTheServingAPI: the serving API passes on both
// paths, as it came (method, path), query included, and so does a JSON
// passthrough whole in one write (the lane gives it to fasthttp).
func TestPassthroughPolicyPassesTheServingAPI(t *testing.T) {
	eng := startRecordingEngine(t)
	for _, sp := range servingPaths {
		t.Run(sp.name, func(t *testing.T) {
			sc := harness.StartSidecar(t, eng.Port(), sp.flags...)
			eng.take()
			var want []string
			for _, rq := range []struct{ method, target, path string }{
				{"GET", "/v1/models?x=1", "/v1/models"},
				{"HEAD", "/v1/models", "/v1/models"},
				{"POST", "/tokenize", "/tokenize"},
				{"POST", "/detokenize", "/detokenize"},
				{"POST", "/v1/embeddings", "/v1/embeddings"},
				{"POST", "/v1/rerank", "/v1/rerank"},
				{"POST", "/pooling", "/pooling"},
				{"GET", "/version", "/version"},
				{"GET", "/ping", "/ping"},
				{"POST", "/generate", "/generate"},
			} {
				c := dialRaw(t, sc)
				body := ""
				if rq.method == "POST" {
					body = `{"prompt":"hi"}`
				}
				c.send(fmt.Sprintf("%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", rq.method, rq.target, len(body), body))
				if rq.method == "HEAD" {
					require.NoError(t, c.conn.SetReadDeadline(time.Now().Add(10*time.Second)))
					resp, err := http.ReadResponse(c.br, &http.Request{Method: http.MethodHead})
					require.NoError(t, err)
					require.Equal(t, http.StatusOK, resp.StatusCode, "HEAD %s", rq.target)
				} else {
					resp, b, _ := c.answer()
					require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s: %s", rq.method, rq.target, b)
					assert.Equal(t, `{"engine":"fake"}`, string(b))
				}
				want = append(want, rq.method+" "+rq.path)
			}
			assert.Equal(t, want, eng.take())
		})
	}
}

// TestPassthroughPolicyFlags: --passthrough-allow-paths lets named paths
// through (an exact one, a prefix), --passthrough-allow-methods a method
// on every path that passes, and the rest stays refused; --passthrough-policy
// all restores forwarding everything; none passes only what is named.
func TestPassthroughPolicyFlags(t *testing.T) {
	eng := startRecordingEngine(t)
	type step struct {
		raw    string
		status int
		seen   string // what the engine must receive ("": nothing)
	}
	post := func(target string) string {
		return "POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	}
	for _, tc := range []struct {
		name  string
		flags []string
		steps []step
	}{
		{"allow paths and methods", []string{"--passthrough-allow-paths=/sleep,/v1/lora/*", "--passthrough-allow-methods=OPTIONS"}, []step{
			{post("/sleep?level=1"), 200, "POST /sleep"},
			{post("/v1/lora/adapter-a/load"), 200, "POST /v1/lora/adapter-a/load"},
			{"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\n\r\n", 200, "OPTIONS /v1/chat/completions"},
			{post("/wake_up"), 403, ""},
			{post("/v1/lora"), 403, ""},
			{"TRACE /sleep HTTP/1.1\r\nHost: x\r\n\r\n", 405, ""},
		}},
		{"none", []string{"--passthrough-policy=none", "--passthrough-allow-paths=/v1/models"}, []step{
			{"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 200, "GET /v1/models"},
			{post("/tokenize"), 403, ""},
		}},
		{"all", []string{"--passthrough-policy=all"}, []step{
			{"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n", 200, "TRACE /"},
			{post("/collective_rpc"), 200, "POST /collective_rpc"},
		}},
	} {
		for _, sp := range servingPaths {
			t.Run(tc.name+"/"+sp.name, func(t *testing.T) {
				sc := harness.StartSidecar(t, eng.Port(), append(append([]string{}, sp.flags...), tc.flags...)...)
				eng.take()
				for _, s := range tc.steps {
					c := dialRaw(t, sc)
					c.send(s.raw)
					resp, b, raw := c.answer()
					require.Equal(t, s.status, resp.StatusCode, "%q: %s", s.raw, raw)
					var want []string
					if s.seen != "" {
						want = []string{s.seen}
						assert.Equal(t, `{"engine":"fake"}`, string(b))
					}
					assert.Equal(t, want, nilIfEmpty(eng.take()), "%q", s.raw)
				}
			})
		}
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// TestMetricsPortMovesMetricsAndDebugOff: without --metrics-port the
// serving port answers the sidecar's own /metrics and /debug/pd; with it,
// both are on the metrics port only (any other path there is a 404), and
// on the serving port /metrics is the engine's (passed through, as
// llm-d's sidecar passes it) while /debug/pd is refused, the engine never
// seeing it.
func TestMetricsPortMovesMetricsAndDebugOff(t *testing.T) {
	eng := startRecordingEngine(t)
	get := func(t *testing.T, url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	t.Run("default", func(t *testing.T) {
		sc := harness.StartSidecar(t, eng.Port())
		eng.take()
		st, b := get(t, sc.URL()+"/metrics")
		require.Equal(t, http.StatusOK, st)
		assert.Contains(t, b, "pd_sidecar_requests_rejected_total")
		st, b = get(t, sc.URL()+"/debug/pd")
		require.Equal(t, http.StatusOK, st, b)
		assert.True(t, gjson.Get(b, "verdict").Exists(), b)
		assert.Empty(t, eng.take())
	})
	for _, sp := range servingPaths {
		t.Run("metrics-port/"+sp.name, func(t *testing.T) {
			mp := harness.FreePort(t)
			sc := harness.StartSidecar(t, eng.Port(), append([]string{"--metrics-port", itoa(mp)}, sp.flags...)...)
			sc.WaitHTTP(t, harness.URL(mp)+"/metrics", 10*time.Second)
			eng.take()
			own := harness.URL(mp)
			st, b := get(t, own+"/metrics")
			require.Equal(t, http.StatusOK, st)
			assert.Contains(t, b, "pd_sidecar_requests_rejected_total")
			st, b = get(t, own+"/debug/pd")
			require.Equal(t, http.StatusOK, st, b)
			assert.True(t, gjson.Get(b, "verdict").Exists(), b)
			st, b = get(t, own+"/v1/models")
			assert.Equal(t, http.StatusNotFound, st, b)
			assert.Empty(t, eng.take(), "the metrics port forwards nothing")

			st, b = get(t, sc.URL()+"/metrics")
			require.Equal(t, http.StatusOK, st, b)
			assert.Equal(t, "fake_engine_metric 1\n", b, "the serving port's /metrics is the engine's")
			assert.Equal(t, []string{"GET /metrics"}, eng.take())
			st, b = get(t, sc.URL()+"/debug/pd")
			assert.Equal(t, http.StatusForbidden, st, b)
			assert.Equal(t, "PermissionDeniedError", gjson.Get(b, "error.type").String(), b)
			assert.NotContains(t, b, "prefillers")
			assert.Empty(t, eng.take(), "/debug/pd is not the engine's")
			assert.Equal(t, 1.0, harness.Metric(t, own+"/metrics", "pd_sidecar_requests_rejected_total", map[string]string{"reason": "path_not_allowed"}))
		})
	}
}

// TestPrefillStripHeaders: with --prefill-strip-headers the client's
// Authorization, Cookie and X-Api-Key reach the decode leg and never a
// prefill leg: on the lane (proven by its request counter), on fasthttp's
// path, for a retried prefill, and for a concurrent connector's prefill
// leg (sglang). Without the flag they reach the prefiller, as in llm-d.
func TestPrefillStripHeaders(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	strip := "--prefill-strip-headers=Authorization,Cookie,X-Api-Key"
	creds := map[string]string{
		"Authorization": "Bearer client-secret", "Cookie": "session=s1", "X-Api-Key": "key-1",
		"x-prefiller-host-port": prefill.HostPort(),
	}
	credNames := []string{"authorization", "cookie", "x-api-key"}
	for _, tc := range []struct {
		name     string
		flags    []string
		lane     bool // the split is the lane's
		retry    bool // the first prefill attempt fails with a 503
		stripped bool
	}{
		{"lane", []string{strip, "--prefill-max-retries=1"}, true, true, true},
		{"stream-loops=0", []string{strip, "--stream-loops=0", "--prefill-max-retries=1"}, false, true, true},
		{"sglang", []string{strip, "--kv-connector=sglang", "--sglang-bootstrap-port", itoa(prefill.BootstrapPort)}, false, false, true},
		{"not stripped by default", nil, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := harness.StartSidecar(t, decode.Port, tc.flags...)
			for _, e := range []*harness.Engine{prefill, decode} {
				clearJournal(t, e)
			}
			if tc.retry {
				setFault(t, prefill, `{"status":503,"times":1,"only":"prefill"}`)
			}
			loop0 := sc.Metric(t, laneRequests, nil)
			resp, b := exchangeRaw(t, sc.Port, "/v1/completions", completionBody(`,"max_tokens":4`), creds, true)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			if tc.lane {
				assert.Equal(t, 1.0, sc.Metric(t, laneRequests, nil)-loop0, "the lane served the split")
			}
			legs := simRequests(t, prefill)
			wantLegs := 1
			if tc.retry {
				wantLegs = 2
			}
			require.Len(t, legs, wantLegs, "prefill legs")
			for i, leg := range legs {
				for _, h := range credNames {
					if tc.stripped {
						assert.Empty(t, leg.Headers[h], "prefill leg %d carries %s", i, h)
					} else {
						assert.NotEmpty(t, leg.Headers[h], "prefill leg %d lacks %s", i, h)
					}
				}
				assert.NotEmpty(t, leg.Headers["content-type"], "prefill leg %d keeps its other headers", i)
			}
			dec := simRequests(t, decode)
			require.NotEmpty(t, dec, "the decode leg")
			last := dec[len(dec)-1]
			assert.Equal(t, []string{"Bearer client-secret"}, last.Headers["authorization"], "the decode leg keeps the client's credentials")
			assert.Equal(t, []string{"key-1"}, last.Headers["x-api-key"])
			assert.Contains(t, strings.Join(last.Headers["cookie"], ";"), "session=s1")
		})
	}
}

// clearJournal forgets an engine-sim's received requests.
func clearJournal(t *testing.T, e *harness.Engine) {
	t.Helper()
	req, err := http.NewRequest(http.MethodDelete, e.URL()+"/sim/requests", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
}
