// Package kvsource decides a request's KV cache source in llm-d's P2P KV
// tier (vLLM's OffloadingConnector P2P tier): every engine serves the
// blocks it holds on a P2P listener, rank r of a pod on rank 0's P2P port
// plus r, and the endpoint picker may name, in
// x-kv-cache-source-host-port, an engine that already holds the prompt's
// prefix. Decide says whether a named source is used, and why not: a value
// that names no host[:port], one the SSRF allowlist refuses, one that is
// the request's prefiller itself or, without a prefiller, the rank serving
// the request. Ports says which P2P port an engine's HTTP port stands for.
// Reading the header, counting and logging the outcome and naming the
// source to an engine are the caller's.
package kvsource

import (
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// Endpoint is a host and port read from a header, normalised for
// comparison: an IP literal in its canonical form (IPv4-mapped IPv6
// unmapped), a name in lower case; port 0 when none was given.
type Endpoint struct {
	Host string
	Port int
}

// ParseEndpoint reads "host[:port]", an http:// or https:// prefix
// tolerated; false when there is no host or the port is not a port.
func ParseEndpoint(v string) (Endpoint, bool) {
	v = strings.TrimSpace(v)
	if len(v) >= 7 && strings.EqualFold(v[:7], "http://") {
		v = v[7:]
	} else if len(v) >= 8 && strings.EqualFold(v[:8], "https://") {
		v = v[8:]
	}
	host, port := v, ""
	if h, p, err := net.SplitHostPort(v); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]") {
		host = v[1 : len(v)-1]
	}
	if host == "" || strings.ContainsAny(host, "/ []@") {
		return Endpoint{}, false
	}
	e := Endpoint{Host: strings.ToLower(host)}
	if a, err := netip.ParseAddr(host); err == nil {
		e.Host = a.Unmap().WithZone("").String()
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n <= 0 || n > 65535 {
			return Endpoint{}, false
		}
		e.Port = n
	}
	return e, true
}

// HostPort joins e back into host:port (port 0: the host alone).
func (e Endpoint) HostPort() string {
	if e.Port == 0 {
		return e.Host
	}
	return net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
}

// Ports are the ports of a pod's engines as llm-d derives them: rank r's
// HTTP server on HTTP+r, its P2P listener on P2P+r.
type Ports struct {
	// HTTP is rank 0's HTTP port (the sidecar's --port).
	HTTP int
	// Ranks is the number of data-parallel ranks (--data-parallel-size).
	Ranks int
	// P2P is rank 0's P2P port (--p2p-connector-port).
	P2P int
}

// P2PPort is the P2P port of the engine whose HTTP port is port: with
// data-parallel ranks, rank r's (port = HTTP + r), else rank 0's.
func (p Ports) P2PPort(port int) int {
	if dp := p.Ranks; dp > 1 {
		if r := port - p.HTTP; r >= 0 && r < dp {
			return p.P2P + r
		}
	}
	return p.P2P
}

// Allowlist admits the sources a request may name (ssrf.Allowlist).
type Allowlist interface {
	// Allowed reports whether hostport may be contacted.
	Allowed(hostport string) bool
}

// Request is the request whose KV cache source is decided.
type Request struct {
	// Prefiller is its prefiller (host:port), "" when none prefills it.
	Prefiller string
	// Port is the HTTP port of the rank serving it.
	Port int
	// OwnHost reports whether host names this pod.
	OwnHost func(host string) bool
	// Allowlist admits sources; nil admits every one.
	Allowlist Allowlist
}

// Decide reads v, an x-kv-cache-source-host-port value, for r: the source
// and metrics.KVSourceUsed when an engine is to pull the prompt's prefix
// from it, else why not (metrics.KVSourceMalformed, KVSourceNotAllowed,
// KVSourcePrefiller, KVSourceOwnRank) and no source.
func Decide(v string, r Request) (Endpoint, string) {
	src, ok := ParseEndpoint(v)
	if !ok {
		return Endpoint{}, metrics.KVSourceMalformed
	}
	if al := r.Allowlist; al != nil && !al.Allowed(src.HostPort()) {
		return Endpoint{}, metrics.KVSourceNotAllowed
	}
	if r.Prefiller != "" {
		if pre, ok := ParseEndpoint(r.Prefiller); ok && pre == src {
			return Endpoint{}, metrics.KVSourcePrefiller
		}
	} else if src.Port == r.Port && r.OwnHost(src.Host) {
		return Endpoint{}, metrics.KVSourceOwnRank
	}
	return src, metrics.KVSourceUsed
}
