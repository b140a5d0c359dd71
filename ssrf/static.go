package ssrf

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Static is a fixed allowlist of CIDRs and host:port patterns, for
// deployments without an InferencePool. Entries:
//
//   - "10.0.0.0/8", "fd00::/8": any port of an IP literal in the prefix;
//   - "10.0.0.0/8:8000", "[fd00::/8]:8000": one port of an IP in the prefix;
//   - "10.1.2.3:8000", "[fd00::1]:8000": one address;
//   - "prefill-0.prefill.ns.svc:8000": one host name (compared as written,
//     case-insensitively; never resolved);
//   - "*.prefill.ns.svc:8000": any host name under a suffix;
//   - a port of "*" admits every port.
//
// IP entries match only IP literals in the header, host-name entries only
// host names, so a name never passes by resolving to an allowed IP.
type Static struct {
	rules []rule
}

type rule struct {
	prefix netip.Prefix // valid for IP rules
	name   string       // exact host name (lower case), or suffix with "."
	suffix bool
	port   uint16 // 0: any port
}

// ParseStatic parses allowlist entries (see Static).
func ParseStatic(entries []string) (*Static, error) {
	s := &Static{}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		r, err := parseRule(e)
		if err != nil {
			return nil, fmt.Errorf("--prefiller-allowlist entry %q: %w", e, err)
		}
		s.rules = append(s.rules, r)
	}
	return s, nil
}

func parseRule(e string) (rule, error) {
	if p, err := netip.ParsePrefix(e); err == nil {
		return rule{prefix: p.Masked()}, nil
	}
	host, port, err := net.SplitHostPort(e)
	if err != nil {
		return rule{}, fmt.Errorf("not a CIDR nor host:port: %w", err)
	}
	var r rule
	if port != "*" {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return rule{}, fmt.Errorf("port %q is not 1-65535 or *", port)
		}
		r.port = uint16(n)
	}
	if p, err := netip.ParsePrefix(host); err == nil {
		r.prefix = p.Masked()
		return r, nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		r.prefix = netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen())
		return r, nil
	}
	host = strings.ToLower(host)
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		host, r.suffix = "."+rest, true
	}
	if !validName(strings.TrimPrefix(host, ".")) {
		return rule{}, fmt.Errorf("host %q is not an IP, a CIDR or a DNS name", host)
	}
	r.name = host
	return r, nil
}

func validName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Len is the number of rules.
func (s *Static) Len() int { return len(s.rules) }

// Allowed implements Allowlist.
func (s *Static) Allowed(hostport string) bool {
	if ap, ok := parseAddrPort(hostport); ok {
		for _, r := range s.rules {
			if r.prefix.IsValid() && (r.port == 0 || r.port == ap.Port()) && r.prefix.Contains(ap.Addr()) {
				return true
			}
		}
		return false
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || !validName(strings.ToLower(host)) {
		return false
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return false
	}
	host = strings.ToLower(host)
	for _, r := range s.rules {
		if r.name == "" || (r.port != 0 && r.port != uint16(n)) {
			continue
		}
		if r.suffix && strings.HasSuffix(host, r.name) && len(host) > len(r.name) || !r.suffix && host == r.name {
			return true
		}
	}
	return false
}
