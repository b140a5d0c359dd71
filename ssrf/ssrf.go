// Package ssrf decides which prefiller addresses the sidecar may contact.
//
// The x-prefiller-host-port header is client-controllable: without a check
// the sidecar would connect to any address a client names, a server-side
// request forgery hole inside the cluster. An Allowlist admits only known
// host:port pairs: the Ready pods of an InferencePool on the pool's target
// ports (PoolWatcher), or a static list of CIDRs and host:port patterns
// (Static). Every check on the request path is lock-free.
package ssrf

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
)

// ErrDenied: the prefiller address is not on the allowlist.
var ErrDenied = errors.New("prefiller not on the allowlist")

// Allowlist reports whether the sidecar may contact a prefiller.
// Implementations are safe for concurrent use and never block.
type Allowlist interface {
	// Allowed reports whether hostport ("host:port", as taken from the
	// header) may be contacted.
	Allowed(hostport string) bool
}

// Any admits an address when any of its allowlists does; an empty Any
// admits nothing.
type Any []Allowlist

// Allowed implements Allowlist.
func (a Any) Allowed(hostport string) bool {
	for _, l := range a {
		if l.Allowed(hostport) {
			return true
		}
	}
	return false
}

// parseAddrPort reads "ip:port" (IPv6 in brackets) into its canonical form;
// ok is false for a host name, a zone, or a bad port.
func parseAddrPort(hostport string) (netip.AddrPort, bool) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return netip.AddrPort{}, false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return netip.AddrPort{}, false
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(p)), true
}

var (
	_ Allowlist = Any(nil)
	_ Allowlist = (*Static)(nil)
	_ Allowlist = (*PoolWatcher)(nil)
)
