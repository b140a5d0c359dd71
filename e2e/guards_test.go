package e2e

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// These tests drive the sidecar's guards (SSRF allowlist, limits, circuit
// breaker, TLS) over real processes, asserting on the simulators' proof
// counters: a denied or skipped prefiller is never contacted.

func TestGuardSSRFStaticAllowlist(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	rogue := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	sc := harness.StartSidecar(t, decode.Port, "--enable-ssrf-protection", "--prefiller-allowlist", prefill.HostPort())
	body := completionBody(`,"max_tokens":6`)

	st, b, _ := scPost(t, sc.URL()+"/v1/completions", body, map[string]string{"x-prefiller-host-port": prefill.HostPort()})
	require.Equal(t, http.StatusOK, st, "%s", b)
	assert.Equal(t, 1.0, decode.Metric(t, "sim_remote_kv_decodes_total", nil), "allowed prefiller used")

	cases := []struct{ name, hdr string }{
		{"other port of an allowed host", rogue.HostPort()},
		{"metadata endpoint", "169.254.169.254:80"},
		{"host name", "localhost:" + itoa(prefill.Port)},
		{"second entry smuggled", rogue.HostPort() + "," + prefill.HostPort()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, b, h := scPost(t, sc.URL()+"/v1/completions", body, map[string]string{
				"x-prefiller-host-port": c.hdr, "X-Request-Id": "ssrf-" + strings.ReplaceAll(c.name, " ", "-")})
			require.Equal(t, http.StatusForbidden, st, "%s", b)
			assert.Equal(t, "application/json", h.Get("Content-Type"))
			assert.Equal(t, int64(403), gjson.GetBytes(b, "error.code").Int())
			assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "not an allowed prefiller")
		})
	}
	assert.Empty(t, simRequests(t, rogue), "a denied prefiller is never contacted")
	assert.Equal(t, float64(len(cases)), sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": "prefiller_not_allowed"}))
	assert.Contains(t, sc.Output(), `"request_id":"ssrf-metadata-endpoint"`, "denial logged with the request id")
	for _, r := range simRequests(t, decode) {
		assert.NotContains(t, r.Headers, "x-prefiller-host-port", "header stripped before forwarding")
	}
}

func TestGuardBadFlagsExit(t *testing.T) {
	decode := harness.StartEngineSim(t, "decode")
	for _, args := range [][]string{
		{"--enable-ssrf-protection"},
		{"--prefiller-allowlist", "10.0.0.0/8"},
		{"--enable-ssrf-protection", "--prefiller-allowlist", "nonsense"},
		{"--enable-ssrf-protection", "--inference-pool", "no-slash"},
		{"--enable-tls", "bogus"},
		{"--secure-proxy", "--cert-path", "/nonexistent"},
		{"--max-header-bytes", "10"},
		{"--circuit-breaker-failures", "-1"},
	} {
		p := harness.Start(t, harness.Binary(t, "pd-sidecar"), append([]string{"--port", itoa(harness.FreePort(t)), "--model-server-port", itoa(decode.Port)}, args...)...)
		code, err := p.Wait(20 * time.Second)
		require.NoError(t, err, "%v", args)
		assert.NotZero(t, code, "%v", args)
		assert.Equal(t, 1, strings.Count(strings.TrimSpace(p.Output()), "\n")+1, "one line for %v: %q", args, p.Output())
	}
}

func TestGuardLimits(t *testing.T) {
	decode := harness.StartEngineSim(t, "decode", "--decode-us-per-token", "20000")
	sc := harness.StartSidecar(t, decode.Port, "--max-request-body-bytes", "4096", "--max-header-bytes", "4096",
		"--max-concurrent-requests", "2")
	t.Run("body 413", func(t *testing.T) {
		big := completionBody(`,"max_tokens":2,"pad":"` + strings.Repeat("x", 8192) + `"`)
		st, b, h := scPost(t, sc.URL()+"/v1/completions", big, map[string]string{"X-Request-Id": "big-body-1"})
		require.Equal(t, http.StatusRequestEntityTooLarge, st, "%s", b)
		assert.Equal(t, int64(413), gjson.GetBytes(b, "error.code").Int())
		assert.Equal(t, "RequestTooLargeError", gjson.GetBytes(b, "error.type").String())
		assert.Equal(t, "big-body-1", h.Get("X-Request-Id"))
		harness.Eventually(t, 30*time.Second, "the log line names the request", func() bool {
			return strings.Contains(sc.Output(), `"request_id":"big-body-1","reason":"body_too_large"`)
		})
	})
	t.Run("headers 431", func(t *testing.T) {
		st, b, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":2`),
			map[string]string{"X-Big": strings.Repeat("y", 8192)})
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, st, "%s", b)
		assert.Equal(t, int64(431), gjson.GetBytes(b, "error.code").Int())
	})
	t.Run("concurrency 503", func(t *testing.T) {
		// Two slow streams fill the bound; a third is refused at once.
		body := completionBody(`,"max_tokens":200,"stream":true`)
		_, c1 := openStream(t, sc.URL()+"/v1/completions", body, nil, 1)
		_, c2 := openStream(t, sc.URL()+"/v1/completions", body, nil, 1)
		st, b, h := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":2`), nil)
		require.Equal(t, http.StatusServiceUnavailable, st, "%s", b)
		assert.Equal(t, "1", h.Get("Retry-After"))
		assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "too many concurrent requests")
		c1()
		c2()
		harness.Eventually(t, 30*time.Second, "slots released", func() bool {
			st, _, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":2`), nil)
			return st == http.StatusOK
		})
		resp, err := http.Get(sc.URL() + "/health")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	})
	m := harness.Scrape(t, sc.URL()+"/metrics")
	for _, r := range []string{"body_too_large", "headers_too_large"} {
		assert.Equal(t, 1.0, m.Value("pd_sidecar_requests_rejected_total", map[string]string{"reason": r}), r)
	}
	assert.GreaterOrEqual(t, m.Value("pd_sidecar_requests_rejected_total", map[string]string{"reason": "overloaded"}), 1.0)
}

func TestGuardCircuitBreakerSkipsDeadPrefiller(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill", "--faults", `{"hang":true}`)
	decode := harness.StartEngineSim(t, "decode")
	// Five skips of at most 1 s each fit in the 6 s cool-down, and a
	// prefill timeout (2 s) does not fit in one.
	const cooldown = 6 * time.Second
	sc := harness.StartSidecar(t, decode.Port, "--prefill-timeout", "2s",
		"--circuit-breaker-failures", "2", "--circuit-breaker-cooldown", cooldown.String())
	body := completionBody(`,"max_tokens":4`)
	st, local, _ := scPost(t, sc.URL()+"/v1/completions", body, nil)
	require.Equal(t, http.StatusOK, st)
	hdr := map[string]string{"x-prefiller-host-port": prefill.HostPort()}
	// Two timeouts open the circuit; the next requests skip the prefiller
	// at once and are served by a local prefill with the same tokens.
	for range 2 {
		st, b, _ := scPost(t, sc.URL()+"/v1/completions", body, hdr)
		require.Equal(t, http.StatusOK, st)
		assert.Equal(t, textOf(local), textOf(b))
	}
	for range 5 {
		var b []byte
		within(t, time.Second, func() { st, b, _ = scPost(t, sc.URL()+"/v1/completions", body, hdr) })
		require.Equal(t, http.StatusOK, st)
		assert.Equal(t, textOf(local), textOf(b))
	}
	assert.Len(t, simRequests(t, prefill), 2, "a dead prefiller costs two timeouts, not one per request")
	assert.Equal(t, 5.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "circuit_open"}))
	assert.Equal(t, 2.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "timeout"}))
	assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_prefiller_circuits_open", nil))

	// The prefiller recovers: after the cool-down one probe closes the circuit.
	req, err := http.NewRequest(http.MethodDelete, prefill.URL()+"/sim/faults", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	time.Sleep(cooldown + 100*time.Millisecond) // the circuit opened before the skips
	st, b, _ := scPost(t, sc.URL()+"/v1/completions", body, hdr)
	require.Equal(t, http.StatusOK, st)
	assert.Equal(t, textOf(local), textOf(b))
	assert.Equal(t, 1.0, decode.Metric(t, "sim_remote_kv_decodes_total", nil), "the probe went disaggregated")
	assert.Equal(t, 0.0, sc.Metric(t, "pd_sidecar_prefiller_circuits_open", nil))
}

func TestGuardSecureProxySelfSigned(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	port := harness.FreePorts(t, 4)
	p := harness.Start(t, harness.Binary(t, "pd-sidecar"), "--port", itoa(port), "--model-server-port", itoa(decode.Port),
		"--secure-proxy", "--metrics-port", itoa(harness.FreePort(t)))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed test cert
	url := fmt.Sprintf("https://%s", harness.HostPort(port))
	harness.Eventually(t, 30*time.Second, "TLS /health", func() bool {
		resp, err := client.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(completionBody(`,"max_tokens":5`)))
	require.NoError(t, err)
	req.Header.Set("x-prefiller-host-port", prefill.HostPort())
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NotNil(t, resp.TLS)
	assert.Equal(t, "pd-sidecar", resp.TLS.PeerCertificates[0].Subject.CommonName)
	assert.Equal(t, 1.0, decode.Metric(t, "sim_remote_kv_decodes_total", nil))
	// Plain HTTP on the TLS port is refused.
	conn, err := net.DialTimeout("tcp", harness.HostPort(port), time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_, _ = conn.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, _ := conn.Read(buf)
	assert.NotContains(t, string(buf[:n]), "200 OK")
	_ = p
}

// TestGuardForgedPrefillersStayBounded sends 100,000 requests naming
// distinct forged prefillers (closed loopback ports: each is dialled and
// refused) and checks that neither metric cardinality nor the sidecar's
// memory grows with them.
func TestGuardForgedPrefillersStayBounded(t *testing.T) {
	decode := harness.StartEngineSim(t, "decode")
	// The sidecar is built without -race here: the race detector's own
	// memory would swamp the RSS being measured (and slow 100,000 requests
	// tenfold).
	sc := &harness.Sidecar{Port: harness.FreePorts(t, 4)}
	sc.Proc = harness.Start(t, buildNoRace(t, "pd-sidecar"), "--port", itoa(sc.Port), "--model-server-port", itoa(decode.Port),
		// Every forged prefiller refuses at once; the connect timeout is
		// only a bound, far past what a busy machine takes to be refused.
		"--prefill-fallback=false", "--log-level", "error", "--connect-timeout", "10s")
	sc.WaitHTTP(t, sc.URL()+"/health", 30*time.Second)
	const n, workers = 100_000, 16
	rss := func() float64 { return sc.Metric(t, "process_resident_memory_bytes", nil) }
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	send := func(from, to int) {
		var wg sync.WaitGroup
		next := make(chan int)
		for range workers {
			wg.Go(func() {
				for i := range next {
					// 127.x.y.z:1 — distinct, syntactically valid, refused at once.
					hp := fmt.Sprintf("127.%d.%d.%d:1", 1+i>>16&127, i>>8&255, i&255)
					req, _ := http.NewRequest(http.MethodPost, sc.URL()+"/v1/completions", strings.NewReader(`{"model":"sim-model","prompt":"x","max_tokens":1}`))
					req.Header.Set("x-prefiller-host-port", hp)
					resp, err := client.Do(req)
					if !assert.NoError(t, err) {
						continue
					}
					_ = resp.Body.Close()
					assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
				}
			})
		}
		for i := from; i < to; i++ {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	send(0, n/5)
	base := rss()
	send(n/5, n)
	after := rss()
	m := harness.Scrape(t, sc.URL()+"/metrics")
	labels := map[string]bool{}
	for _, name := range []string{"pd_sidecar_prefill_duration_seconds"} {
		for _, s := range m[name].GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "prefiller" {
					labels[l.GetValue()] = true
				}
			}
		}
	}
	assert.LessOrEqual(t, len(labels), 65, "at most 64 prefiller labels plus other")
	assert.True(t, labels["other"])
	assert.Equal(t, float64(n), m.Value("pd_sidecar_prefill_duration_seconds", nil))
	t.Logf("RSS after %d forged prefillers: %.0f MiB; after %d: %.0f MiB", n/5, base/(1<<20), n, after/(1<<20))
	assert.Less(t, after-base, float64(32<<20), "memory does not grow with forged prefillers")
}

// buildNoRace compiles ./cmd/<name> without the race detector.
func buildNoRace(t *testing.T, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = harness.RepoRoot(t)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	return out
}
