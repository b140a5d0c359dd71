package guard

import (
	"fmt"
	"time"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/proxy/tlsconf"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// Config is the proxy's protection against untrusted input, overload and
// failing prefillers. Start from DefaultConfig.
type Config struct {
	// Allowlist admits prefillers (--enable-ssrf-protection); nil admits
	// every syntactically valid host:port.
	Allowlist ssrf.Allowlist
	// TrustClientKVParams keeps the client's own connector fields
	// (kv_transfer_params, bootstrap_host ...: connectors.ClientFieldNames)
	// in the bodies sent to engines, for setups where something upstream
	// sends them legitimately (--trust-client-kv-params); with an
	// Allowlist, the addresses they name must be on it. False removes them.
	TrustClientKVParams bool
	// RefuseUnknownKVMembers refuses a prefill answer whose
	// kv_transfer_params carry a member the connector does not document
	// (--kv-params-unknown-members=refuse): a local prefill then,
	// invalid_kv_params. False passes such members on to the decode engine
	// unchanged when they name no address (connectors.Passable), counted.
	RefuseUnknownKVMembers bool
	// Breaker is the per-prefiller circuit breaker.
	Breaker circuit.Config
	// MaxHeaderBytes bounds the request line and headers (431 above); it
	// is also the read buffer of a connection while it reads a request
	// (released once the request is read), 8 KiB by default (nginx's and
	// Apache's usual header limit).
	MaxHeaderBytes int
	// ReadTimeout bounds reading a request's head and body.
	ReadTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle that long.
	IdleTimeout time.Duration
	// MaxConcurrentRequests bounds inference requests in flight, streams
	// included (503 above); 0 leaves them unbounded.
	MaxConcurrentRequests int
	// MaxBufferedBytes bounds the bytes buffered at once by all
	// connections together: request bodies read whole before they are
	// served (503 past it, before the body is read) and answers read whole
	// (upstream.Budget).
	MaxBufferedBytes int64
	// TLS is the serving and upstream TLS.
	TLS tlsconf.Config
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Breaker:               circuit.DefaultConfig(),
		MaxHeaderBytes:        8 << 10,
		ReadTimeout:           60 * time.Second,
		IdleTimeout:           90 * time.Second,
		MaxConcurrentRequests: 10000,
		MaxBufferedBytes:      DefaultMaxBufferedBytes,
	}
}

// DefaultMaxBufferedBytes is --max-buffered-bytes outside a container with
// a memory limit, and its most within one.
const DefaultMaxBufferedBytes = 512 << 20

// Validate reports the first invalid setting, as one line.
func (c Config) Validate() error {
	switch {
	case c.MaxHeaderBytes < 1024:
		return fmt.Errorf("--max-header-bytes must be >= 1024, got %d", c.MaxHeaderBytes)
	case c.ReadTimeout <= 0:
		return fmt.Errorf("--read-timeout must be > 0, got %v", c.ReadTimeout)
	case c.IdleTimeout <= 0:
		return fmt.Errorf("--idle-timeout must be > 0, got %v", c.IdleTimeout)
	case c.MaxConcurrentRequests < 0:
		return fmt.Errorf("--max-concurrent-requests must be >= 0, got %d", c.MaxConcurrentRequests)
	case c.MaxBufferedBytes <= 0:
		return fmt.Errorf("--max-buffered-bytes must be > 0, got %d", c.MaxBufferedBytes)
	}
	if err := c.Breaker.Validate(); err != nil {
		return err
	}
	return c.TLS.Validate()
}
