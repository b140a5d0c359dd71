package moriwrite

import (
	"context"
	"net"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/hostdns"
)

// State is MoRI-IO's state in a sidecar: its configuration and the
// resolver of the host specs the legs name (run as background work).
type State struct {
	Cfg Config
	Dns *hostdns.Resolver
}

// NewState is the state of MoRI-IO write mode with cfg.
func NewState(cfg Config, m *metrics.MoriIO, log zerolog.Logger) *State {
	lookup := cfg.Lookup
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	return &State{Cfg: cfg, Dns: hostdns.New(lookup, cfg.DNSTTL, cfg.DNSTimeout, cfg.Seed, m, log)}
}

// Ready reports whether every host spec a split's legs name resolves
// without waiting on DNS (hostdns.Resolver.Ready); otherwise a split
// waits on their resolution (the feature's PrepareStep).
func (s *State) Ready() bool {
	return s.Dns.Ready(s.Cfg.PodIP) && s.Dns.Ready(s.Cfg.RemoteHosts...) && s.Dns.Ready(s.Cfg.DecodeHosts...)
}

// Addrs are the addresses of MoRI-IO's host specs a request's legs name:
// its pod's, the decode hosts' and the remote (prefill) hosts'.
type Addrs struct {
	Pod            string
	Decode, Remote []string
}

// Resolve resolves every host spec the legs name, waiting on DNS for one
// that has no address yet.
func (s *State) Resolve(ctx context.Context) *Addrs {
	return &Addrs{Pod: s.Dns.Resolve(ctx, s.Cfg.PodIP), Decode: s.hosts(ctx, s.Cfg.DecodeHosts), Remote: s.hosts(ctx, s.Cfg.RemoteHosts)}
}

// hosts resolves specs (nil for none).
func (s *State) hosts(ctx context.Context, specs []string) []string {
	if len(specs) == 0 {
		return nil
	}
	out := make([]string, len(specs))
	for i, h := range specs {
		out[i] = s.Dns.Resolve(ctx, h)
	}
	return out
}
