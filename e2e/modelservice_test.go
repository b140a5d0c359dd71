package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest/modelservice"
	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestModelserviceArgListsServeASplit starts the real sidecar with every
// distinct argument list llm-d's modelservice chart rendered
// (deploy/rendertest/testdata/llm-d-modelservice.json), each unchanged but
// for its ports (free loopback ports for --port and --vllm-port) and its
// --cert-path (a directory holding a certificate made here), and serves a
// split through it: a prefill on engine-sim's prefill engine, proven by the
// decode engine's remote-KV counter. With --prefiller-use-tls=true the
// prefiller is reached through a TLS front the sidecar trusts by the
// standard SSL_CERT_FILE; with --secure-proxy=true the client speaks TLS.
func TestModelserviceArgListsServeASplit(t *testing.T) {
	f, err := modelservice.Load()
	require.NoError(t, err)
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	target, err := url.Parse(prefill.URL())
	require.NoError(t, err)
	front := httptest.NewTLSServer(httputil.NewSingleHostReverseProxy(target))
	t.Cleanup(front.Close)
	frontCA := filepath.Join(t.TempDir(), "front-ca.pem")
	require.NoError(t, os.WriteFile(frontCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: front.Certificate().Raw}), 0o600))
	t.Setenv("SSL_CERT_FILE", frontCA) // inherited by the sidecars started below
	certDir, certPool := servingCert(t)

	for _, l := range f.ArgLists() {
		t.Run(strings.Join(l.Args, " "), func(t *testing.T) {
			port := harness.FreePorts(t, 4)
			args := make([]string, 0, len(l.Args))
			val := map[string]string{}
			for _, a := range l.Args {
				k, v, _ := strings.Cut(a, "=")
				val[k] = v
				switch k {
				case "--port":
					a = k + "=" + itoa(port)
				case "--vllm-port":
					a = k + "=" + itoa(decode.Port)
				case "--cert-path":
					a = k + "=" + certDir
				}
				args = append(args, a)
			}
			p := harness.Start(t, harness.Binary(t, "pd-sidecar"), args...)
			client, base := http.DefaultClient, harness.URL(port)
			if val["--secure-proxy"] == "true" {
				tc := &tls.Config{RootCAs: certPool}
				if val["--cert-path"] == "" {
					tc = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the sidecar's self-signed certificate
				}
				client = &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
				base = "https://" + harness.HostPort(port)
			}
			harness.Eventually(t, 30*time.Second, "sidecar /health", func() bool {
				if p.Exited() {
					t.Fatalf("pd-sidecar exited with %v (cases %v):\n%s", args, l.Cases, p.Output())
				}
				resp, err := client.Get(base + "/health")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK
			})
			prefiller := prefill.HostPort()
			if val["--prefiller-use-tls"] == "true" {
				prefiller = front.Listener.Addr().String()
			}
			before := decode.Metric(t, "sim_remote_kv_decodes_total", nil)
			req, err := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(completionBody(`,"max_tokens":4`)))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("x-prefiller-host-port", prefiller)
			resp, err := client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, 1.0, decode.Metric(t, "sim_remote_kv_decodes_total", nil)-before,
				"the decode ran on KV prefilled remotely (cases %v)", l.Cases)
		})
	}
}

// servingCert writes a self-signed certificate for 127.0.0.1 as tls.crt and
// tls.key into a new directory, the layout --cert-path reads, and returns
// the directory and a pool that trusts the certificate.
func servingCert(t *testing.T) (string, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "modelservice-test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kb, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600))
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return dir, pool
}
