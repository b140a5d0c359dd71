package proxy

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// maxProbesPerRound bounds the prefillers probed in one round. Their
// addresses come from a client header, so the open circuits may be many and
// forged; past the bound a round probes some of them (the breakers pick,
// in map order, so later rounds reach others) and the cool-down's trial
// request remains the fallback for the rest.
const maxProbesPerRound = 64

// dialFunc connects to addr (net.Dialer.DialContext; a test's fake).
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// probeTargets is what the prober needs of the circuit breakers: the open
// circuits worth a probe, and a place for each probe's result.
type probeTargets interface {
	// probeList returns up to limit prefillers to probe now.
	probeList(limit int) []string
	// probed records that a probe of hp found it up (it accepted the
	// connection) or down.
	probed(hp string, up bool)
}

// circuitProber connects to the prefillers whose circuit is open, every
// interval, so that one back on its port gets splits again within about an
// interval instead of at the end of --circuit-breaker-cooldown. A connect
// is the whole probe: it costs the engine no work, and the half-open trial
// request it lets through is the real check (guard.probed, circuit.Probed).
type circuitProber struct {
	targets  probeTargets
	dial     dialFunc
	interval time.Duration
	timeout  time.Duration // each connect's bound, below interval
	limit    int
}

// newCircuitProber returns a prober of g's breakers, or nil when probing is
// off (--circuit-probe-interval 0, or no breaker). Each connect is bounded
// by half the interval (at most connectTimeout), so a round ends before
// the next is due.
func newCircuitProber(g *guard, connectTimeout time.Duration) *circuitProber {
	b := g.cfg.Breaker
	if b.Failures == 0 || b.ProbeInterval <= 0 {
		return nil
	}
	var d net.Dialer
	return &circuitProber{
		targets: g, dial: d.DialContext, interval: b.ProbeInterval,
		timeout: min(b.ProbeInterval/2, connectTimeout), limit: maxProbesPerRound,
	}
}

// Run probes every interval until ctx is done, and returns once the round
// in progress has ended.
func (pr *circuitProber) Run(ctx context.Context) {
	t := time.NewTicker(pr.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pr.round(ctx)
		}
	}
}

// round probes the listed prefillers at once, each with its own connect,
// and returns when all have reported. A probe cut short by ctx reports
// nothing: it learned nothing of the prefiller.
func (pr *circuitProber) round(ctx context.Context) {
	var wg sync.WaitGroup
	for _, hp := range pr.targets.probeList(pr.limit) {
		wg.Go(func() {
			up := pr.probe(ctx, hp)
			if ctx.Err() == nil {
				pr.targets.probed(hp, up)
			}
		})
	}
	wg.Wait()
}

// probe reports whether hp accepts a TCP connection within the timeout;
// the connection is closed at once, before any byte is sent.
func (pr *circuitProber) probe(ctx context.Context, hp string) bool {
	ctx, cancel := context.WithTimeout(ctx, pr.timeout)
	defer cancel()
	c, err := pr.dial(ctx, "tcp", hp)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// probeList lists the open circuits a connect probe may end (probeTargets).
func (g *guard) probeList(limit int) []string { return g.breakers.Probes(limit) }

// probed records a probe's result on hp's breaker, counts it, and keeps
// the open-circuits gauge current (probeTargets). A probe that found hp up
// leaves the circuit open with its cool-down ended, rather than closing it:
// the next request to hp is the half-open trial and is split at once, as it
// would be on a closed circuit, while a prefiller that accepts connections
// but cannot serve costs one failed trial, not --circuit-breaker-failures
// of them.
func (g *guard) probed(hp string, up bool) {
	g.breakers.Probed(hp, up)
	result := metrics.ProbeDown
	if up {
		result = metrics.ProbeUp
	}
	g.m.CircuitProbes.WithLabelValues(result).Inc()
	g.trackCircuit(hp)
}

var _ background = (*circuitProber)(nil)
