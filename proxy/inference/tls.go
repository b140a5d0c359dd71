package inference

import (
	"crypto/tls"
	"time"

	"github.com/pd-sidecar/pd-sidecar/proxy/tlsconf"
)

// TLSConfig is the serving and upstream TLS of the proxy (tlsconf.Config).
type TLSConfig = tlsconf.Config

// Names of the certificate files in --cert-path: tlsconf's.
const (
	CertFile = tlsconf.CertFile
	KeyFile  = tlsconf.KeyFile
)

// SelfSignedCert makes an ECDSA P-256 certificate for hosts (DNS names or
// IPs), valid for the given duration (tlsconf.SelfSignedCert).
func SelfSignedCert(hosts []string, valid time.Duration) (tls.Certificate, error) {
	return tlsconf.SelfSignedCert(hosts, valid)
}
