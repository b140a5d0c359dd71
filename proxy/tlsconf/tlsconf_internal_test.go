package tlsconf

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
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

	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

func newReq(addr, path string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(path)
	req.Header.SetHost(addr)
	req.SetBodyString(`{}`)
	return req
}

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

func TestServerHotReload(t *testing.T) {
	dir := t.TempDir()
	first := writeCert(t, dir, "first")
	s, err := NewServer(dir, zerolog.Nop())
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

	_, err = NewServer(t.TempDir(), zerolog.Nop())
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
		cfg  Config
		ok   bool
	}{
		{"verified with the CA bundle", Config{Prefiller: true, CAFile: ca}, true},
		{"unknown CA refused", Config{Prefiller: true}, false},
		{"skip verify", Config{Prefiller: true, InsecureSkipVerifyPrefiller: true}, true},
		{"plain to a TLS server fails", Config{Decoder: true, CAFile: ca}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := tt.cfg.Upstream([]string{"127.0.0.1:1"})
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
	f, err := Config{}.Upstream(nil)
	require.NoError(t, err)
	assert.Nil(t, f, "no TLS leg: plain transport")
	_, err = Config{Prefiller: true, CAFile: "/nonexistent"}.Upstream(nil)
	assert.Error(t, err)
}
