package proxy

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// writeCert writes a fresh self-signed pair for 127.0.0.1 into dir and
// returns its certificate.
func writeCert(t *testing.T, dir, cn string) *x509.Certificate {
	t.Helper()
	c, err := SelfSignedCert([]string{"127.0.0.1", "localhost"}, time.Hour)
	require.NoError(t, err)
	c.Leaf.Subject.CommonName = cn
	key, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	require.NoError(t, err)
	tmp := filepath.Join(dir, ".tmp")
	require.NoError(t, os.WriteFile(tmp+CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o600))
	require.NoError(t, os.WriteFile(tmp+KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: key}), 0o600))
	require.NoError(t, os.Rename(tmp+CertFile, filepath.Join(dir, CertFile)))
	require.NoError(t, os.Rename(tmp+KeyFile, filepath.Join(dir, KeyFile)))
	return c.Leaf
}

func TestServerTLSHotReload(t *testing.T) {
	dir := t.TempDir()
	first := writeCert(t, dir, "first")
	s, err := newServerTLS(dir, zerolog.Nop())
	require.NoError(t, err)
	got, err := s.getCertificate(nil)
	require.NoError(t, err)
	assert.Equal(t, first.Raw, got.Certificate[0])

	// The new pair's mtimes are set past the old ones: a change the
	// fingerprint sees whatever the clock's or the file system's grain.
	var last time.Time
	for _, f := range []string{CertFile, KeyFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err)
		if st.ModTime().After(last) {
			last = st.ModTime()
		}
	}
	second := writeCert(t, dir, "second")
	for _, f := range []string{CertFile, KeyFile} {
		require.NoError(t, os.Chtimes(filepath.Join(dir, f), last.Add(time.Second), last.Add(time.Second)))
	}
	s.maybeReload(time.Now().Add(2 * certCheckInterval))
	got, _ = s.getCertificate(nil)
	assert.Equal(t, second.Raw, got.Certificate[0], "reloaded after the files changed")

	// A broken pair keeps the previous certificate.
	require.NoError(t, os.WriteFile(filepath.Join(dir, KeyFile), []byte("garbage"), 0o600))
	s.maybeReload(time.Now().Add(4 * certCheckInterval))
	got, _ = s.getCertificate(nil)
	assert.Equal(t, second.Raw, got.Certificate[0])

	_, err = newServerTLS(t.TempDir(), zerolog.Nop())
	assert.Error(t, err, "an empty --cert-path is an error")
}

func TestUpstreamTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"tls":true}`))
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	tests := []struct {
		name string
		cfg  TLSConfig
		ok   bool
	}{
		{"verified with the CA bundle", TLSConfig{Prefiller: true, CAFile: ca}, true},
		{"unknown CA refused", TLSConfig{Prefiller: true}, false},
		{"skip verify", TLSConfig{Prefiller: true, InsecureSkipVerifyPrefiller: true}, true},
		{"plain to a TLS server fails", TLSConfig{Decoder: true, CAFile: ca}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := tt.cfg.upstreamTLS([]string{"127.0.0.1:1"})
			require.NoError(t, err)
			tr := upstream.NewTransport(time.Second, 4, 4)
			tr.UseTLS(f)
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(resp)
			_, err = tr.Do(context.Background(), addr, newReq(addr, "/x"), resp)
			if !tt.ok {
				// A refused handshake, or Go's 400 for plain HTTP on a TLS port.
				assert.True(t, err != nil || resp.StatusCode() == http.StatusBadRequest, "err %v status %d", err, resp.StatusCode())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, `{"tls":true}`, string(resp.Body()))
		})
	}
	f, err := TLSConfig{}.upstreamTLS(nil)
	require.NoError(t, err)
	assert.Nil(t, f, "no TLS leg: plain transport")
	_, err = TLSConfig{Prefiller: true, CAFile: "/nonexistent"}.upstreamTLS(nil)
	assert.Error(t, err)
}

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
