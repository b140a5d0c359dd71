// Package circuitprobe re-checks the prefillers whose circuit is open: it
// connects to each, every interval, and reports whether it accepted, so
// that one back on its port gets splits again within about an interval
// instead of at the end of the breaker's cool-down. The circuits, and
// what a probe's result does to them, are its Targets'.
package circuitprobe

import (
	"context"
	"net"
	"sync"
	"time"
)

// maxPerRound bounds the prefillers probed in one round. Their addresses
// come from a client header, so the open circuits may be many and forged;
// past the bound a round probes some of them (the breakers pick, in map
// order, so later rounds reach others) and the cool-down's trial request
// remains the fallback for the rest.
const maxPerRound = 64

// DialFunc connects to addr (net.Dialer.DialContext; a test's fake).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Targets is what the prober needs of the circuit breakers: the open
// circuits worth a probe, and a place for each probe's result. Both are
// called from the prober's goroutines, Probed from several at once.
type Targets interface {
	// ProbeList returns up to limit prefillers to probe now.
	ProbeList(limit int) []string
	// Probed records that a probe of hp found it up (it accepted the
	// connection) or down.
	Probed(hp string, up bool)
}

// Prober connects to the prefillers whose circuit is open, every interval.
// A connect is the whole probe: it costs the engine no work, and the
// half-open trial request it lets through is the real check
// (Targets.Probed, circuit.Probed).
type Prober struct {
	targets  Targets
	dial     DialFunc
	interval time.Duration
	timeout  time.Duration // each connect's bound, below interval
	limit    int
}

// New returns a prober of targets every interval (> 0). Each connect is
// bounded by half the interval (at most connectTimeout), so a round ends
// before the next is due.
func New(targets Targets, interval, connectTimeout time.Duration) *Prober {
	var d net.Dialer
	return &Prober{
		targets: targets, dial: d.DialContext, interval: interval,
		timeout: min(interval/2, connectTimeout), limit: maxPerRound,
	}
}

// Run probes every interval until ctx is done, and returns once the round
// in progress has ended.
func (pr *Prober) Run(ctx context.Context) {
	t := time.NewTicker(pr.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pr.Round(ctx)
		}
	}
}

// Round probes the listed prefillers at once, each with its own connect,
// and returns when all have reported. A probe cut short by ctx reports
// nothing: it learned nothing of the prefiller.
func (pr *Prober) Round(ctx context.Context) {
	var wg sync.WaitGroup
	for _, hp := range pr.targets.ProbeList(pr.limit) {
		wg.Go(func() {
			up := pr.probe(ctx, hp)
			if ctx.Err() == nil {
				pr.targets.Probed(hp, up)
			}
		})
	}
	wg.Wait()
}

// probe reports whether hp accepts a TCP connection within the timeout;
// the connection is closed at once, before any byte is sent.
func (pr *Prober) probe(ctx context.Context, hp string) bool {
	ctx, cancel := context.WithTimeout(ctx, pr.timeout)
	defer cancel()
	c, err := pr.dial(ctx, "tcp", hp)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}
