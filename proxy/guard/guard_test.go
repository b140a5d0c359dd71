package guard_test

import (
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
	"github.com/pd-sidecar/pd-sidecar/proxy/tlsconf"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

func TestSecureListener(t *testing.T) {
	g, err := guard.New(guard.Config{TLS: tlsconf.Config{SecureProxy: true}, Breaker: circuit.DefaultConfig()}, guard.Deps{Log: zerolog.Nop()})
	require.NoError(t, err)
	require.True(t, g.Secure())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tln := g.WrapListener(ln)
	defer tln.Close()
	srv := &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) { rc.SetBodyString("hello") }}
	go func() { _ = srv.Serve(tln) }()
	defer func() { _ = srv.Shutdown() }()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed
	resp, err := c.Get("https://" + ln.Addr().String() + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "pd-sidecar", resp.TLS.PeerCertificates[0].Subject.CommonName)
}

func TestPlainListener(t *testing.T) {
	g, err := guard.New(guard.DefaultConfig(), guard.Deps{})
	require.NoError(t, err)
	assert.False(t, g.Secure())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	assert.Equal(t, ln, g.WrapListener(ln), "plain HTTP: the listener as it is")
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, guard.DefaultConfig().Validate())
	unused := guard.DefaultConfig()
	unused.TLS.CertPath = "/nonexistent"
	require.NoError(t, unused.Validate(), "a cert path without --secure-proxy is unused, as in llm-d")
	tests := []struct {
		name string
		mod  func(*guard.Config)
		want string
	}{
		{"header", func(c *guard.Config) { c.MaxHeaderBytes = 10 }, "--max-header-bytes"},
		{"read", func(c *guard.Config) { c.ReadTimeout = 0 }, "--read-timeout"},
		{"idle", func(c *guard.Config) { c.IdleTimeout = -1 }, "--idle-timeout"},
		{"concurrency", func(c *guard.Config) { c.MaxConcurrentRequests = -1 }, "--max-concurrent-requests"},
		{"buffered", func(c *guard.Config) { c.MaxBufferedBytes = 0 }, "--max-buffered-bytes"},
		{"breaker", func(c *guard.Config) { c.Breaker.Failures = -1 }, "--circuit-breaker-failures"},
		{"ca file", func(c *guard.Config) { c.TLS.CAFile = "/nonexistent" }, "--tls-ca-file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := guard.DefaultConfig()
			tt.mod(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestAcquire(t *testing.T) {
	for _, tc := range []struct {
		name  string
		max   int
		admit int // admitted before the first refusal; -1: none refused
	}{
		{"bounded", 2, 2},
		{"unbounded", 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := guard.DefaultConfig()
			cfg.MaxConcurrentRequests = tc.max
			g, err := guard.New(cfg, guard.Deps{})
			require.NoError(t, err)
			for i := range 5 {
				assert.Equal(t, tc.admit < 0 || i < tc.admit, g.Acquire(), "request %d", i)
			}
			if tc.admit >= 0 {
				g.Release()
				assert.True(t, g.Acquire(), "a released slot admits again")
			}
		})
	}
}

func TestAdmitPrefiller(t *testing.T) {
	static, err := ssrf.ParseStatic([]string{"10.0.0.0/8"})
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		allow  ssrf.Allowlist
		hp     string
		denied bool
	}{
		{"no protection", nil, "192.168.1.1:8000", false},
		{"on the allowlist", static, "10.1.2.3:8000", false},
		{"off the allowlist", static, "192.168.1.1:8000", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := metrics.NewGuards(prometheus.NewRegistry())
			cfg := guard.DefaultConfig()
			cfg.Allowlist = tc.allow
			g, err := guard.New(cfg, guard.Deps{Metrics: m})
			require.NoError(t, err)
			err = g.AdmitPrefiller(tc.hp)
			counted := testutil.ToFloat64(m.Rejected.WithLabelValues(metrics.RejectSSRF))
			if !tc.denied {
				assert.NoError(t, err)
				assert.Zero(t, counted)
				return
			}
			assert.ErrorIs(t, err, guard.ErrPrefillerDenied)
			assert.ErrorIs(t, err, ssrf.ErrDenied)
			assert.Equal(t, 1.0, counted)
		})
	}
}

// TestBreaker: the breaker's verdicts and the open-circuits gauge, over
// the outcomes BreakerResult judges.
func TestBreaker(t *testing.T) {
	errDown, errGone := errors.New("down"), errors.New("gone")
	judge := func(err error) circuit.Result {
		switch {
		case err == nil:
			return circuit.Success
		case errors.Is(err, errGone):
			return circuit.Neutral
		}
		return circuit.Failure
	}
	m := metrics.NewGuards(prometheus.NewRegistry())
	cfg := guard.DefaultConfig()
	cfg.Breaker = circuit.Config{Failures: 2, Cooldown: time.Hour, MaxTracked: 16}
	g, err := guard.New(cfg, guard.Deps{Metrics: m, BreakerResult: judge})
	require.NoError(t, err)

	hp := "10.0.0.1:8000"
	for _, outcome := range []error{errDown, errGone, errDown} {
		tk, err := g.AllowPrefill(hp)
		require.NoError(t, err)
		g.BreakerDone(hp, tk, outcome)
	}
	assert.Equal(t, circuit.Open, g.CircuitInfo(hp).State, "two failures; the client that left says nothing")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitOpen))
	_, err = g.AllowPrefill(hp)
	require.ErrorIs(t, err, guard.ErrCircuitOpen)
	assert.EqualError(t, err, "prefiller circuit open: 10.0.0.1:8000 skipped for up to 1h0m0s")

	g.BreakerDone(hp, nil, nil) // no prefill taken: nothing to report
	assert.Equal(t, circuit.Open, g.CircuitInfo(hp).State)

	long := strings.Repeat("h", 300) + ":1"
	for range 2 {
		tk, err := g.AllowPrefill(long)
		require.NoError(t, err)
		g.BreakerDone(long, tk, errDown)
	}
	assert.Equal(t, 2.0, testutil.ToFloat64(m.CircuitOpen))
	_, err = g.AllowPrefill(long)
	assert.EqualError(t, err, "prefiller circuit open: "+strings.Repeat("h", 256)+"... skipped for up to 1h0m0s",
		"a client-controlled address is shortened")
}

// TestBreakerDefaultResult: without a BreakerResult, a failed prefill is a
// failure and an answered one a success.
func TestBreakerDefaultResult(t *testing.T) {
	m := metrics.NewGuards(prometheus.NewRegistry())
	cfg := guard.DefaultConfig()
	cfg.Breaker = circuit.Config{Failures: 1, Cooldown: time.Hour, MaxTracked: 16}
	g, err := guard.New(cfg, guard.Deps{Metrics: m})
	require.NoError(t, err)
	tk, err := g.AllowPrefill("a:1")
	require.NoError(t, err)
	g.BreakerDone("a:1", tk, nil)
	assert.Equal(t, circuit.Closed, g.CircuitInfo("a:1").State)
	tk, err = g.AllowPrefill("a:1")
	require.NoError(t, err)
	g.BreakerDone("a:1", tk, errors.New("refused"))
	assert.Equal(t, circuit.Open, g.CircuitInfo("a:1").State)
}

// TestProbed: a probe's result is counted and recorded on the breaker; one
// that found the prefiller up makes its next request the half-open trial,
// whose success closes the circuit and the gauge with it.
func TestProbed(t *testing.T) {
	m := metrics.NewGuards(prometheus.NewRegistry())
	cfg := guard.DefaultConfig()
	cfg.Breaker = circuit.Config{Failures: 1, Cooldown: time.Hour, ProbeInterval: time.Second, MaxTracked: 16}
	g, err := guard.New(cfg, guard.Deps{Metrics: m, BreakerResult: func(err error) circuit.Result {
		if err != nil {
			return circuit.Unreachable
		}
		return circuit.Success
	}})
	require.NoError(t, err)
	hp := "10.0.0.1:8000"
	tk, err := g.AllowPrefill(hp)
	require.NoError(t, err)
	g.BreakerDone(hp, tk, errors.New("connection refused"))
	assert.Equal(t, []string{hp}, g.ProbeList(8))

	g.Probed(hp, false)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitProbes.WithLabelValues(metrics.ProbeDown)))
	_, err = g.AllowPrefill(hp)
	assert.ErrorIs(t, err, guard.ErrCircuitOpen, "still down: still skipped")

	g.Probed(hp, true)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitProbes.WithLabelValues(metrics.ProbeUp)))
	assert.True(t, g.CircuitInfo(hp).ProbeUp)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitOpen), "open until the trial succeeds")
	tk, err = g.AllowPrefill(hp)
	require.NoError(t, err, "the next request is the trial")
	g.BreakerDone(hp, tk, nil)
	assert.Equal(t, circuit.Closed, g.CircuitInfo(hp).State)
	assert.Zero(t, testutil.ToFloat64(m.CircuitOpen))
}

// TestBudgetShared: request bodies and answers read whole draw from one
// budget, --max-buffered-bytes, whose use the gauge shows.
func TestBudgetShared(t *testing.T) {
	m := metrics.NewGuards(prometheus.NewRegistry())
	cfg := guard.DefaultConfig()
	cfg.MaxBufferedBytes = 1 << 20
	g, err := guard.New(cfg, guard.Deps{MaxBody: 1 << 20, Metrics: m})
	require.NoError(t, err)
	rc := &fasthttp.RequestCtx{}
	rc.Request.Header.SetContentLength(600 << 10)
	g.Bodies().HeaderReceived(&rc.Request.Header)
	assert.Equal(t, int64(600<<10), g.Budget().Used())
	assert.Equal(t, float64(600<<10), testutil.ToFloat64(m.BufferedBytes))
	assert.False(t, g.Budget().TryReserve(600<<10), "the answer does not fit beside the body")
	refused := &fasthttp.RequestCtx{}
	refused.Request.Header.SetContentLength(600 << 10)
	assert.Equal(t, 1, g.Bodies().HeaderReceived(&refused.Request.Header).MaxRequestBodySize, "no room: failed before it is read")
	assert.True(t, g.Bodies().ErrorClaim(refused), "refused by the budget: answered 503")
	assert.False(t, g.Bodies().ErrorClaim(rc), "read, not refused")
	assert.Zero(t, g.Budget().Used(), "a failed read gives its hold back")
}
