package core

import (
	"net/netip"
	"strings"
)

// What an upstream's answer may point at. A prefill answer's handoff names
// where the decode engine (nixlv2: the prefiller's NIXL side channel;
// MoRI-IO: its handshake and notify ports) or the sidecar itself (the
// sidecar connector: a kvtransfer agent) connects next, and an ec-nixl
// encoder's answer where the engines fetch an item's encoding. The
// connector reads those addresses out of the answer (connectors.Addr);
// with SSRF protection on, each must be on the host of the upstream that
// answered — the host the header named and the allowlist admitted, at any
// port, since the side channel and the agent are other ports of the same
// pod — or be itself on the allowlist. Anything else makes the answer
// unusable before anything connects to it: a prefill answer falls back to
// a local prefill at once (invalid_kv_params), an encoder answer fails its
// leg (bad_answer). Without SSRF protection any address passes: the header
// can name any prefiller then, which could answer any address.

// sameHost reports whether a and b name the same host: equal IP addresses
// (an IPv4-mapped IPv6 address equal to its IPv4 one), or equal DNS names
// but for letter case and a final dot. A name never equals an address: no
// name is resolved.
func sameHost(a, b string) bool {
	x, errX := netip.ParseAddr(a)
	y, errY := netip.ParseAddr(b)
	if errX == nil || errY == nil {
		return errX == nil && errY == nil && x.Zone() == "" && y.Zone() == "" && x.Unmap() == y.Unmap()
	}
	return a != "" && strings.EqualFold(strings.TrimSuffix(a, "."), strings.TrimSuffix(b, "."))
}
