package inference

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/hostdns"
)

// MoriIOConfig is MoRI-IO write mode on the nixlv2 connector (AMD's KV
// transfer engine: the prefill engine writes the prompt's KV into the
// decode engine). Off unless WriteMode; ignored by other connectors.
type MoriIOConfig struct {
	// WriteMode turns MoRI-IO write mode on: serial (prefill, then decode)
	// unless ParallelDispatch.
	WriteMode bool
	// ParallelDispatch sends both legs at once; the decode leg's output is
	// held until the prefill leg answered, within WaitTimeout.
	ParallelDispatch bool
	// Ports are the notify and handshake ports and the TP/DP sizes.
	Ports moriio.Ports
	// PodIP is this (decode) pod's host spec: an IP, or a name resolved.
	PodIP string
	// RemoteHosts and DecodeHosts are the wide-EP prefill and decode host
	// specs (empty: a single host each).
	RemoteHosts, DecodeHosts []string
	// WaitTimeout bounds, in parallel dispatch, the wait for the prefill
	// leg's outcome before the decode leg produced output; past it the
	// request degrades to a local prefill (reason kv_wait_timeout).
	WaitTimeout time.Duration
	// DNSTTL is how long a resolved host spec is fresh; DNSTimeout bounds
	// each lookup.
	DNSTTL, DNSTimeout time.Duration
	// Seed holds the addresses of the host specs resolved at startup.
	Seed map[string]string
	// Lookup resolves names (nil: net.DefaultResolver.LookupHost).
	Lookup hostdns.LookupFunc
}

// Validate reports the first invalid MoRI-IO setting.
func (c MoriIOConfig) Validate() error {
	if !c.WriteMode {
		if c.ParallelDispatch {
			return errors.New("--moriio-parallel-dispatch needs --moriio-write-mode")
		}
		return nil
	}
	switch {
	case c.PodIP == "":
		return errors.New("--moriio-write-mode needs --moriio-local-pod-ip or POD_IP")
	case c.Ports.DPSize < 1 || c.Ports.TPSize < 1 || c.Ports.DPSizeLocal < 0:
		return fmt.Errorf("MoRI-IO sizes tp %d, dp %d, dp-local %d are invalid", c.Ports.TPSize, c.Ports.DPSize, c.Ports.DPSizeLocal)
	case c.WaitTimeout <= 0:
		return fmt.Errorf("--moriio-parallel-decode-wait-timeout %v must be > 0", c.WaitTimeout)
	case c.DNSTTL <= 0 || c.DNSTimeout <= 0:
		return fmt.Errorf("MoRI-IO DNS ttl %v and timeout %v must be > 0", c.DNSTTL, c.DNSTimeout)
	}
	return nil
}

// moriState is MoRI-IO's per-proxy state.
type moriState struct {
	Cfg MoriIOConfig
	Dns *hostdns.Resolver
}

func newMoriState(cfg MoriIOConfig, m *metrics.MoriIO, log zerolog.Logger) *moriState {
	lookup := cfg.Lookup
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	return &moriState{Cfg: cfg, Dns: hostdns.New(lookup, cfg.DNSTTL, cfg.DNSTimeout, cfg.Seed, m, log)}
}

// Ready reports whether every host spec a split's legs name resolves
// without waiting on DNS (hostdns.Resolver.Ready); otherwise a split's
// admission waits on their resolution (moriResolveStep).
func (s *moriState) Ready() bool {
	return s.Dns.Ready(s.Cfg.PodIP) && s.Dns.Ready(s.Cfg.RemoteHosts...) && s.Dns.Ready(s.Cfg.DecodeHosts...)
}

// moriAddrs are the addresses of MoRI-IO's host specs a request's legs
// name: its pod's, the decode hosts' and the remote (prefill) hosts'.
type moriAddrs struct {
	pod            string
	decode, remote []string
}

// resolve resolves every host spec the legs name, waiting on DNS for one
// that has no address yet.
func (s *moriState) resolve(ctx context.Context) *moriAddrs {
	return &moriAddrs{pod: s.Dns.Resolve(ctx, s.Cfg.PodIP), decode: s.Hosts(ctx, s.Cfg.DecodeHosts), remote: s.Hosts(ctx, s.Cfg.RemoteHosts)}
}

// addrs are the addresses r's legs name: those its admission's step
// resolved, or, when every spec had one already (Ready), resolved now
// without waiting.
func (s *moriState) addrs(r *Request) *moriAddrs {
	if r.moriAddrs == nil {
		r.moriAddrs = s.resolve(r.Ctx)
	}
	return r.moriAddrs
}

// moriResolveStep is the blocking step a split's admission waits on while
// one of MoRI-IO's host specs has no address yet (nil: MoRI-IO is off, or
// every spec resolves without waiting): the legs are then built without
// waiting on DNS, on either driver.
func (p *Proxy) moriResolveStep(r *Request) feature.Step {
	s := p.Mori
	if s == nil || s.Ready() {
		return nil
	}
	return func(ctx context.Context) func() {
		a := s.resolve(ctx)
		return func() { r.moriAddrs = a }
	}
}

// Hosts resolves specs (nil for none).
func (s *moriState) Hosts(ctx context.Context, specs []string) []string {
	if len(specs) == 0 {
		return nil
	}
	out := make([]string, len(specs))
	for i, h := range specs {
		out[i] = s.Dns.Resolve(ctx, h)
	}
	return out
}

// MoriLeg starts the request's MoRI-IO legs: its rank, transfer id and
// x-data-parallel-rank header.
func MoriLeg(r *Request) moriio.Leg {
	l := moriio.Leg{Rank: moriio.PickRank(r.ID, r.P.Mori.Cfg.Ports.DPSize), TransferID: moriio.TransferID(r.ID)}
	setMoriRank(r, l.Rank)
	return l
}

// setMoriRank sets the x-data-parallel-rank of the legs sent from now on
// (none when the data-parallel size is 1).
func setMoriRank(r *Request, rank int) {
	if r.P.Mori.Cfg.Ports.DPSize > 1 {
		r.moriRank = strconv.Itoa(rank)
	}
}

// moriPrefillBody gives the serial prefill leg's body (nixlv2's) MoRI-IO's
// write-mode kv_transfer_params.
func moriPrefillBody(r *Request, body []byte) ([]byte, error) {
	s := r.P.Mori
	r.mori = MoriLeg(r)
	a := s.addrs(r)
	params := moriio.PrefillParams(s.Cfg.Ports, a.pod, r.mori, a.decode)
	return moriio.WithParams(body, params)
}

// moriDecodeParams are the serial decode leg's kv_transfer_params: the
// prefill answer's with the rank (the one it returned, else the request
// id's) written back and MoRI-IO's fields backfilled.
func moriDecodeParams(r *Request, returned []byte) ([]byte, error) {
	s := r.P.Mori
	l := r.mori
	l.Rank = moriio.DecodeRank(returned, s.Cfg.Ports.DPSize, l.Rank)
	setMoriRank(r, l.Rank)
	return moriio.SerialDecodeParams(returned, s.Cfg.Ports, l, s.addrs(r).remote)
}
