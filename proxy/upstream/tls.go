package upstream

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
)

// UseTLS makes the transport speak TLS to the upstreams for which f
// returns a config (nil f, or a nil config: plain TCP). The config's
// ServerName defaults to the address's host. Call it before the first leg.
func (t *Transport) UseTLS(f func(addr string) *tls.Config) { t.tlsFor = f }

// UsesTLS reports whether the transport speaks TLS to addr.
func (t *Transport) UsesTLS(addr string) bool { return t.tlsFor != nil && t.tlsFor(addr) != nil }

// Dial connects to addr within the transport's connect timeout, with the
// TLS handshake (bounded by the same timeout) when the upstream uses TLS:
// the connection a leg is sent on, for a caller that sends it itself (an
// event loop).
func (t *Transport) Dial(addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), t.connectTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil || t.tlsFor == nil {
		return conn, err
	}
	cfg := t.tlsFor(addr)
	if cfg == nil {
		return conn, nil
	}
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("tls handshake with %s: %w", addr, err)
	}
	return tc, nil
}
