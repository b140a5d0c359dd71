package proxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/circuit"
)

func TestSecureListener(t *testing.T) {
	g, err := newGuard(GuardConfig{TLS: TLSConfig{SecureProxy: true}, Breaker: circuit.DefaultConfig()}, 0, nil, zerolog.Nop())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tln := g.wrapListener(ln)
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

func TestGuardConfigValidate(t *testing.T) {
	require.NoError(t, DefaultGuardConfig().Validate())
	unused := DefaultGuardConfig()
	unused.TLS.CertPath = "/nonexistent"
	require.NoError(t, unused.Validate(), "a cert path without --secure-proxy is unused, as in llm-d")
	tests := []struct {
		name string
		mod  func(*GuardConfig)
		want string
	}{
		{"header", func(c *GuardConfig) { c.MaxHeaderBytes = 10 }, "--max-header-bytes"},
		{"read", func(c *GuardConfig) { c.ReadTimeout = 0 }, "--read-timeout"},
		{"idle", func(c *GuardConfig) { c.IdleTimeout = -1 }, "--idle-timeout"},
		{"concurrency", func(c *GuardConfig) { c.MaxConcurrentRequests = -1 }, "--max-concurrent-requests"},
		{"breaker", func(c *GuardConfig) { c.Breaker.Failures = -1 }, "--circuit-breaker-failures"},
		{"ca file", func(c *GuardConfig) { c.TLS.CAFile = "/nonexistent" }, "--tls-ca-file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultGuardConfig()
			tt.mod(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestClassifyGuards(t *testing.T) {
	assert.Equal(t, outcome{status: 403}, classify(fmt.Errorf("%w: x", ErrPrefillerDenied)))
	assert.Equal(t, outcome{status: 503, reason: ReasonCircuitOpen}, classify(fmt.Errorf("%w: x", ErrCircuitOpen)))
	assert.Equal(t, circuit.Failure, breakerResult(fmt.Errorf("%w: x", ErrPrefillTimeout)))
	assert.Equal(t, circuit.Unreachable, breakerResult(fmt.Errorf("%w: x", ErrPrefillUnreachable)))
	assert.Equal(t, circuit.Failure, breakerResult(fmt.Errorf("%w: x", ErrPrefillServerError)))
	assert.Equal(t, circuit.Neutral, breakerResult(ErrClientGone))
	assert.Equal(t, circuit.Success, breakerResult(ErrPrefillOverloaded))
	assert.Equal(t, circuit.Success, breakerResult(nil))
}
