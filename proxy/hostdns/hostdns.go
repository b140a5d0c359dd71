// Package hostdns resolves MoRI-IO's host specs (this pod's and the wide-EP
// hosts', which go into the legs' kv_transfer_params): once with PickIP, and
// on the request path with a Resolver, which reuses an address while it is
// fresh and revalidates it in the background once stale, so that a request
// waits on DNS only for a name with no address yet.
package hostdns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// LookupFunc resolves a host name to its addresses (net.Resolver.LookupHost).
type LookupFunc func(ctx context.Context, host string) ([]string, error)

// ErrNoAddress: a host name resolved to no address.
var ErrNoAddress = errors.New("no address")

// PickIP is the address of a host spec: the spec itself when it is a
// literal IP, else the first IPv4 address lookup gives, else its first.
func PickIP(ctx context.Context, lookup LookupFunc, spec string) (string, error) {
	if net.ParseIP(spec) != nil {
		return spec, nil
	}
	addrs, err := lookup(ctx, spec)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", spec, err)
	}
	if len(addrs) == 0 {
		return "", fmt.Errorf("resolve %s: %w", spec, ErrNoAddress)
	}
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil && ip.To4() != nil {
			return a, nil
		}
	}
	return addrs[0], nil
}

// Resolver resolves MoRI-IO host specs on the request path: an address
// is fresh for ttl; a stale one is served while one background lookup
// revalidates it (stale-while-revalidate); a spec with no address yet is
// looked up once for all the requests that want it (singleflight), each
// lookup bounded by timeout. A failed lookup keeps the stale address (for
// another ttl); with none, the raw spec is used. Seeded with the addresses
// resolved at startup.
type Resolver struct {
	lookup       LookupFunc
	ttl, timeout time.Duration
	m            *metrics.MoriIO
	log          zerolog.Logger
	now          func() time.Time
	// bg is the context of background revalidations (ended by Run).
	bg     context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	byHost map[string]*dnsEntry
}

type dnsEntry struct {
	ip       string    // "" until a lookup succeeded
	at       time.Time // when ip was last confirmed (or last tried)
	inflight chan struct{}
}

// New returns a resolver of host specs by lookup, seeded with seed (spec
// to address), counting in m and logging to log.
func New(lookup LookupFunc, ttl, timeout time.Duration, seed map[string]string, m *metrics.MoriIO, log zerolog.Logger) *Resolver {
	bg, stop := context.WithCancel(context.Background())
	r := &Resolver{lookup: lookup, ttl: ttl, timeout: timeout, m: m, log: log, now: time.Now,
		bg: bg, stop: stop, byHost: make(map[string]*dnsEntry, len(seed))}
	now := r.now()
	for spec, ip := range seed {
		r.byHost[spec] = &dnsEntry{ip: ip, at: now}
	}
	return r
}

// Run returns once ctx is done and the background revalidations, which
// it cancels, have ended. They are started by the lookups of stale
// addresses, from New on.
func (r *Resolver) Run(ctx context.Context) {
	<-ctx.Done()
	r.stop()
	r.wg.Wait()
}

// Resolve returns spec's address (see Resolver): its address, or spec
// itself when it is a literal IP or has none.
func (r *Resolver) Resolve(ctx context.Context, spec string) string {
	if spec == "" || net.ParseIP(spec) != nil {
		return spec
	}
	r.mu.Lock()
	e := r.byHost[spec]
	if e == nil {
		e = &dnsEntry{}
		r.byHost[spec] = e
	}
	switch {
	case e.ip != "" && r.now().Sub(e.at) < r.ttl:
		ip := e.ip
		r.mu.Unlock()
		return ip
	case e.ip != "":
		// Stale: served now, revalidated once in the background.
		ip := e.ip
		if e.inflight == nil {
			e.inflight = make(chan struct{})
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.refresh(r.bg, spec, e)
			}()
		}
		r.mu.Unlock()
		return ip
	case e.inflight != nil:
		wait := e.inflight
		r.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return spec
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if e.ip == "" {
			return spec
		}
		return e.ip
	}
	e.inflight = make(chan struct{})
	r.mu.Unlock()
	r.refresh(ctx, spec, e)
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.ip == "" {
		return spec // cold start and the lookup failed: the raw spec
	}
	return e.ip
}

// Ready reports whether each of specs resolves without waiting: it is
// empty, a literal IP, or has an address (fresh or stale; a stale one is
// served while it is revalidated). An address, once had, is kept through
// failed lookups, so a spec that is ready stays ready. The event loops
// serve only requests whose specs are ready: they may not wait on DNS.
func (r *Resolver) Ready(specs ...string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, spec := range specs {
		if spec == "" || net.ParseIP(spec) != nil {
			continue
		}
		if e := r.byHost[spec]; e == nil || e.ip == "" {
			return false
		}
	}
	return true
}

// refresh looks spec up and records the outcome in e, whose inflight
// channel it closes.
func (r *Resolver) refresh(ctx context.Context, spec string, e *dnsEntry) {
	r.m.DNSReresolve.Inc()
	lctx, cancel := context.WithTimeout(ctx, r.timeout)
	ip, err := PickIP(lctx, r.lookup, spec)
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() {
		close(e.inflight)
		e.inflight = nil
	}()
	e.at = r.now()
	if err != nil {
		r.m.DNSLookupFailures.Inc()
		ev := r.log.Warn().Err(err).Str("host", spec)
		if e.ip != "" {
			ev = ev.Str("stale_ip", e.ip)
		}
		ev.Msg("MoRI-IO host lookup failed; using the last address, else the spec")
		return
	}
	if e.ip != "" && e.ip != ip {
		r.m.DNSIPChanged.Inc()
		r.log.Info().Str("host", spec).Str("old_ip", e.ip).Str("ip", ip).Msg("MoRI-IO host changed address")
	}
	e.ip = ip
}
