// Package tlsconf is the TLS of the sidecar's ports and of its upstream
// legs: Config (--secure-proxy, --cert-path, --enable-tls and their kin),
// the serving certificate (a --cert-path directory reloaded when its files
// change, or a self-signed one) and the client config of each upstream.
// It makes configs and certificates; the listeners and transports that use
// them are the proxy's and proxy/upstream's.
package tlsconf

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Names of the certificate files in --cert-path (as llm-d and Kubernetes
// TLS secrets have them).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// certCheckInterval is how often, at most, a handshake looks for new
// certificate files.
const certCheckInterval = time.Second

// Config is the serving and upstream TLS of the proxy.
type Config struct {
	// SecureProxy serves the proxy ports over TLS (--secure-proxy).
	SecureProxy bool
	// CertPath is a directory holding tls.crt and tls.key, reloaded when
	// they change; "" serves a self-signed certificate made at start.
	// Without SecureProxy it is unused and not read, as in llm-d
	// (llm-d-modelservice renders --cert-path next to --secure-proxy=false
	// when certPath is set and secure is not).
	CertPath string
	// Prefiller and Decoder use TLS on the prefill and decode legs
	// (--enable-tls prefiller,decoder).
	Prefiller, Decoder bool
	// InsecureSkipVerifyPrefiller and InsecureSkipVerifyDecoder skip
	// certificate verification on those legs (--tls-insecure-skip-verify).
	InsecureSkipVerifyPrefiller, InsecureSkipVerifyDecoder bool
	// CAFile is a PEM bundle of the CAs trusted on upstream legs ("": the
	// system pool).
	CAFile string
}

// Validate reports the first invalid setting, as one line.
func (c Config) Validate() error {
	if c.CAFile != "" {
		if _, err := os.Stat(c.CAFile); err != nil {
			return fmt.Errorf("--tls-ca-file: %w", err)
		}
	}
	return nil
}

// Server serves the certificate of --cert-path, reloading it when the
// files change (checked at most once a second, on a handshake), or a
// self-signed one.
type Server struct {
	dir  string
	log  zerolog.Logger
	cert atomic.Pointer[tls.Certificate]

	mu      sync.Mutex // one reload at a time
	checked time.Time
	stamp   string // mod times and sizes of the loaded files
}

// NewServer loads the key pair of dir (CertFile and KeyFile), or makes a
// self-signed certificate for localhost when dir is ""; log receives the
// reloads.
func NewServer(dir string, log zerolog.Logger) (*Server, error) {
	s := &Server{dir: dir, log: log}
	if dir == "" {
		c, err := SelfSignedCert([]string{"localhost"}, 365*24*time.Hour)
		if err != nil {
			return nil, err
		}
		s.cert.Store(&c)
		log.Warn().Msg("--secure-proxy without --cert-path: serving a self-signed certificate")
		return s, nil
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) stampOf() (string, error) {
	var b bytes.Buffer
	for _, f := range []string{CertFile, KeyFile} {
		st, err := os.Stat(filepath.Join(s.dir, f))
		if err != nil {
			return "", fmt.Errorf("--cert-path: %w", err)
		}
		fmt.Fprintf(&b, "%d/%d;", st.ModTime().UnixNano(), st.Size())
	}
	return b.String(), nil
}

// load reads the key pair; the caller holds s.mu or owns s.
func (s *Server) load() error {
	stamp, err := s.stampOf()
	if err != nil {
		return err
	}
	c, err := tls.LoadX509KeyPair(filepath.Join(s.dir, CertFile), filepath.Join(s.dir, KeyFile))
	if err != nil {
		return fmt.Errorf("--cert-path %s: %w", s.dir, err)
	}
	s.cert.Store(&c)
	s.stamp = stamp
	return nil
}

// getCertificate is tls.Config.GetCertificate: the current certificate,
// reloaded first when the files changed.
func (s *Server) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if s.dir != "" {
		s.maybeReload(time.Now())
	}
	return s.cert.Load(), nil
}

func (s *Server) maybeReload(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.checked) < certCheckInterval {
		return
	}
	s.checked = now
	stamp, err := s.stampOf()
	if err != nil || stamp == s.stamp {
		return
	}
	if err := s.load(); err != nil {
		// A half-written pair: keep serving the old one, retry next time.
		s.log.Warn().Err(err).Msg("certificate files changed but do not load; keeping the previous certificate")
		return
	}
	s.log.Info().Str("cert_path", s.dir).Msg("certificate reloaded")
}

// Config is the listener's TLS config: TLS 1.2 or later, HTTP/1.1, the
// current certificate.
func (s *Server) Config() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.getCertificate, NextProtos: []string{"http/1.1"}}
}

// SelfSignedCert makes an ECDSA P-256 certificate for hosts (DNS names or
// IPs), valid for the given duration.
func SelfSignedCert(hosts []string, valid time.Duration) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "pd-sidecar", Organization: []string{"pd-sidecar"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(valid),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// Upstream returns, for upstream.Transport.UseTLS, the client TLS config of
// each upstream: decoder settings for the local engine addresses, prefiller
// settings for any other; nil for plain legs.
func (c Config) Upstream(local []string) (func(addr string) *tls.Config, error) {
	if !c.Prefiller && !c.Decoder {
		return nil, nil
	}
	var roots *x509.CertPool
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca-file: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca-file %s: no PEM certificate", c.CAFile)
		}
	}
	mk := func(on, skip bool) *tls.Config {
		if !on {
			return nil
		}
		return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, InsecureSkipVerify: skip, //nolint:gosec // operator's choice
			NextProtos: []string{"http/1.1"}, ClientSessionCache: tls.NewLRUClientSessionCache(256)}
	}
	pre := mk(c.Prefiller, c.InsecureSkipVerifyPrefiller)
	dec := mk(c.Decoder, c.InsecureSkipVerifyDecoder)
	locals := make(map[string]bool, len(local))
	for _, a := range local {
		locals[a] = true
	}
	return func(addr string) *tls.Config {
		if locals[addr] {
			return dec
		}
		return pre
	}, nil
}
