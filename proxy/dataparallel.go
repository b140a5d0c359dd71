package proxy

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// llm-d's deprecated data-parallel rank selector: an inference request
// whose x-data-parallel-host-port names one of this pod's ranks
// (PodIP:Port+r) is decoded by rank r's engine, whichever rank's port it
// arrived on; the prefill leg, if any, is unchanged. The header never
// reaches an engine (upstreamHeader, rawhttp.AppendLegStart, passthrough), and the
// lane leaves a request carrying it to fasthttp (rawhttp.ScanRequest).

// rankFor returns the local engine that x-data-parallel-host-port value v
// names: the engine of rank r when v is one of this pod's hosts with port
// Port+r; else ErrUnknownRank.
func (p *Proxy) rankFor(v []byte) (string, error) {
	hp := string(bytes.TrimSpace(v))
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return "", fmt.Errorf("%w: %q is not host:port", ErrUnknownRank, logValue(hp))
	}
	n, err := strconv.Atoi(port)
	rank := n - p.cfg.Port
	if err != nil || rank < 0 || rank >= p.cfg.DataParallelSize || !p.ownHost(host) {
		return "", fmt.Errorf("%w: %q (ranks are %s)", ErrUnknownRank, logValue(hp), p.rankRange())
	}
	return p.localAddr(rank), nil
}

// ownHost reports whether host names this pod: PodIP when set, else Host,
// else (all interfaces) a loopback address or localhost. IP literals are
// compared as addresses.
func (p *Proxy) ownHost(host string) bool {
	own := p.cfg.PodIP
	if own == "" {
		own = p.cfg.Host
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
func (p *Proxy) rankRange() string {
	host := p.cfg.PodIP
	if host == "" {
		host = p.cfg.Host
	}
	if a, err := netip.ParseAddr(host); host == "" || err == nil && a.IsUnspecified() {
		host = "127.0.0.1"
	}
	last := p.cfg.Port + p.cfg.DataParallelSize - 1
	if last == p.cfg.Port {
		return net.JoinHostPort(host, strconv.Itoa(last))
	}
	return net.JoinHostPort(host, strconv.Itoa(p.cfg.Port)) + " to port " + strconv.Itoa(last)
}

// pickRank points r's decode legs at the rank its x-data-parallel-host-port
// names (none: r's own rank). An unknown value is counted and refused
// before any leg.
func (r *request) pickRank(h *fasthttp.RequestHeader) error {
	v := h.Peek(HeaderDataParallel)
	if v == nil {
		return nil
	}
	local, err := r.p.rankFor(v)
	if err != nil {
		r.p.m.Guards.Rejected.WithLabelValues(metrics.RejectUnknownRank).Inc()
		return err
	}
	if local != r.local {
		r.logAt(zerolog.DebugLevel).Str("engine", local).Msg("x-data-parallel-host-port: decoded by another rank's engine")
	}
	r.local = local
	return nil
}
