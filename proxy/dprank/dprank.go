// Package dprank is llm-d's deprecated data-parallel rank selector: which
// of this pod's ranks an x-data-parallel-host-port value names. A value
// naming one of this pod's hosts (PodIP:Port+r) names rank r, whose engine
// then decodes the request, whichever rank's port it arrived on; anything
// else is ErrUnknown. Picker is the admitter (proxy/feature) that reads
// the header, refuses a request naming no rank and points its decode legs
// at the rank's engine.
package dprank

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/proxy/logvalue"
)

// ErrUnknown: x-data-parallel-host-port names no data-parallel rank of
// this pod, or is not host:port.
var ErrUnknown error = failure.New("x-data-parallel-host-port names no data-parallel rank of this pod", failure.Outcome{Status: http.StatusBadRequest})

// Pod is this pod's data-parallel ranks, as the selector names them.
type Pod struct {
	// Port is rank 0's serving port; rank r serves on Port+r.
	Port int
	// Size is the number of ranks (--data-parallel-size).
	Size int
	// PodIP is this pod's address (POD_IP); empty: unknown.
	PodIP string
	// Host is the listen host (--host), this pod's name when PodIP is
	// empty; empty or unspecified: all interfaces.
	Host string
}

// Rank returns the rank that x-data-parallel-host-port value v names:
// rank r when v is one of this pod's hosts with port Port+r; else
// ErrUnknown.
func (p Pod) Rank(v []byte) (int, error) {
	hp := string(bytes.TrimSpace(v))
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not host:port", ErrUnknown, logvalue.Cut(hp))
	}
	n, err := strconv.Atoi(port)
	rank := n - p.Port
	if err != nil || rank < 0 || rank >= p.Size || !p.OwnHost(host) {
		return 0, fmt.Errorf("%w: %q (ranks are %s)", ErrUnknown, logvalue.Cut(hp), p.rankRange())
	}
	return rank, nil
}

// OwnHost reports whether host names this pod: PodIP when set, else Host,
// else (all interfaces) a loopback address or localhost. IP literals are
// compared as addresses.
func (p Pod) OwnHost(host string) bool {
	own := p.PodIP
	if own == "" {
		own = p.Host
	}
	if a, err := netip.ParseAddr(own); own == "" || err == nil && a.IsUnspecified() {
		if strings.EqualFold(host, "localhost") {
			return true
		}
		h, err := netip.ParseAddr(host)
		return err == nil && h.IsLoopback()
	}
	a, err1 := netip.ParseAddr(own)
	h, err2 := netip.ParseAddr(host)
	if err1 == nil && err2 == nil {
		return a.Unmap() == h.Unmap()
	}
	return strings.EqualFold(own, host)
}

// rankRange says which values name a rank, for the error message.
func (p Pod) rankRange() string {
	host := p.PodIP
	if host == "" {
		host = p.Host
	}
	if a, err := netip.ParseAddr(host); host == "" || err == nil && a.IsUnspecified() {
		host = "127.0.0.1"
	}
	last := p.Port + p.Size - 1
	if last == p.Port {
		return net.JoinHostPort(host, strconv.Itoa(last))
	}
	return net.JoinHostPort(host, strconv.Itoa(p.Port)) + " to port " + strconv.Itoa(last)
}
