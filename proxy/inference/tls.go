package inference

import (
	"crypto/tls"
	"time"

	"github.com/pd-sidecar/pd-sidecar/proxy/tlsconf"
)

// SelfSignedCert makes an ECDSA P-256 certificate for hosts (DNS names or
// IPs), valid for the given duration (tlsconf.SelfSignedCert).
func SelfSignedCert(hosts []string, valid time.Duration) (tls.Certificate, error) {
	return tlsconf.SelfSignedCert(hosts, valid)
}
