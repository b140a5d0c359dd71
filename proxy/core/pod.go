package core

import (
	"net"
	"net/netip"
	"strconv"

	"github.com/pd-sidecar/pd-sidecar/proxy/dprank"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvsource"
)

// pod is what the sidecar knows of its pod: its ports (one per
// data-parallel rank), its engines' addresses and P2P ports, and the
// addresses it goes by.
type pod struct{ cfg *Config }

// localAddr is the address of the local engine of data-parallel rank.
func (p pod) localAddr(rank int) string {
	return net.JoinHostPort(p.cfg.ModelServerHost, strconv.Itoa(p.cfg.ModelServerPort+rank))
}

// p2pPort is the P2P port of the engine whose HTTP port is port: with
// data-parallel ranks, rank r's (port = --port + r), else rank 0's, as
// llm-d derives it.
func (p pod) p2pPort(port int) int { return p.p2pPorts().P2PPort(port) }

// p2pPorts are the pod's engines' HTTP and P2P ports.
func (p pod) p2pPorts() kvsource.Ports {
	return kvsource.Ports{HTTP: p.cfg.Port, Ranks: p.cfg.DataParallelSize, P2P: p.cfg.P2P.Port}
}

// dpPod is this pod's data-parallel ranks.
func (p pod) dpPod() dprank.Pod {
	return dprank.Pod{Port: p.cfg.Port, Size: p.cfg.DataParallelSize, PodIP: p.cfg.PodIP, Host: p.cfg.Host}
}

// podAddr is this pod's IP address: POD_IP, else --host when it is one
// address (not all interfaces); "" when neither says.
func (p pod) podAddr() string {
	for _, h := range []string{p.cfg.PodIP, p.cfg.Host} {
		if a, err := netip.ParseAddr(h); err == nil && !a.IsUnspecified() {
			return a.String()
		}
	}
	return ""
}

// ownHost reports whether host names this pod (dprank.Pod.OwnHost).
func (p pod) ownHost(host string) bool { return p.dpPod().OwnHost(host) }

// ownAddr reports whether hp is one of the sidecar's own ports: warming
// it would send the sidecar requests of its own.
func (p pod) ownAddr(hp string) bool {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < p.cfg.Port || n >= p.cfg.Port+p.cfg.DataParallelSize {
		return false
	}
	if host == p.cfg.PodIP || host == p.cfg.Host || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// localAddrs are the local engine addresses of every data-parallel rank.
func (p pod) localAddrs() []string {
	out := make([]string, p.cfg.DataParallelSize)
	for r := range out {
		out[r] = p.localAddr(r)
	}
	return out
}
