package inference

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/pd-sidecar/pd-sidecar/connectors"
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

// refusedAddr returns the first of addrs, named by the answer of the
// upstream peer (host:port), that SSRF protection refuses; ok is true when
// none is refused, or SSRF protection is off.
func (p *Proxy) refusedAddr(peer string, addrs []connectors.Addr) (refused connectors.Addr, ok bool) {
	al := p.Cfg.Guard.Allowlist
	if al == nil || len(addrs) == 0 {
		return connectors.Addr{}, true
	}
	own, _, err := net.SplitHostPort(peer)
	if err != nil {
		own = peer
	}
	for _, a := range addrs {
		if sameHost(a.Host, own) {
			continue
		}
		if a.Port > 0 && al.Allowed(net.JoinHostPort(a.Host, strconv.Itoa(a.Port))) {
			continue
		}
		return a, false
	}
	return connectors.Addr{}, true
}

// checkHandoff refuses a handoff whose addresses refusedAddr refuses for
// prefiller: ErrInvalidKVParams naming the member, never the address
// (an upstream's bytes).
func (p *Proxy) checkHandoff(prefiller string, h connectors.Handoff) error {
	if a, ok := p.refusedAddr(prefiller, h.Addrs); !ok {
		return fmt.Errorf("%w: %s names an address that is neither the prefiller's host nor on the allowlist",
			connectors.ErrInvalidKVParams, a.Field)
	}
	return nil
}

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
