package guard

import (
	"time"

	"fmt"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/circuitprobe"
	"github.com/pd-sidecar/pd-sidecar/proxy/logvalue"
)

// AllowPrefill asks prefiller hp's circuit breaker for a prefill: its
// ticket, whose outcome BreakerDone reports, or ErrCircuitOpen (a reason
// to fall back) while the circuit is open. Every choreography asks here.
func (g *Guard) AllowPrefill(hp string) (*circuit.Ticket, error) {
	tk, ok := g.breakers.Allow(hp)
	if !ok {
		return nil, fmt.Errorf("%w: %s skipped for up to %v", ErrCircuitOpen, logvalue.Cut(hp), g.cfg.Breaker.Cooldown)
	}
	return tk, nil
}

// BreakerDone reports the outcome err of a prefill to prefiller hp that tk
// allowed (nil: none was taken) to its circuit breaker, judged by
// Deps.BreakerResult, and keeps the open-circuits gauge current.
func (g *Guard) BreakerDone(hp string, tk *circuit.Ticket, err error) {
	if tk == nil {
		return
	}
	tk.Done(g.result(err))
	g.trackCircuit(hp)
}

// CircuitInfo is what is known of prefiller hp's circuit.
func (g *Guard) CircuitInfo(hp string) circuit.Info { return g.breakers.Info(hp) }

// trackCircuit keeps the open-circuits gauge current for hp.
func (g *Guard) trackCircuit(hp string) {
	open := g.breakers.State(hp) != circuit.Closed
	g.openMu.Lock()
	defer g.openMu.Unlock()
	_, was := g.open[hp]
	switch {
	case open && !was:
		g.open[hp] = struct{}{}
	case !open && was:
		delete(g.open, hp)
	}
	g.m.CircuitOpen.Set(float64(len(g.open)))
}

// ProbeList lists the open circuits a connect probe may end
// (circuitprobe.Targets).
func (g *Guard) ProbeList(limit int) []string { return g.breakers.Probes(limit) }

// Probed records a probe's result on hp's breaker, counts it, and keeps
// the open-circuits gauge current (circuitprobe.Targets). A probe that
// found hp up leaves the circuit open with its cool-down ended, rather
// than closing it: the next request to hp is the half-open trial and is
// split at once, as it would be on a closed circuit, while a prefiller
// that accepts connections but cannot serve costs one failed trial, not
// --circuit-breaker-failures of them.
func (g *Guard) Probed(hp string, up bool) {
	g.breakers.Probed(hp, up)
	result := metrics.ProbeDown
	if up {
		result = metrics.ProbeUp
	}
	g.m.CircuitProbes.WithLabelValues(result).Inc()
	g.trackCircuit(hp)
}

var _ circuitprobe.Targets = (*Guard)(nil)

// CircuitState reports the circuit-breaker state of prefiller (host:port):
// "closed", "open" or "half_open"; with --circuit-probe-interval, an open
// circuit being probed reads "open (probing)", and one a probe found back,
// whose next request is the half-open trial, "open (probe up)". "" when no
// breaker is configured. It lets /debug/pd show per-prefiller circuits
// (status.CircuitStates).
func (g *Guard) CircuitState(prefiller string) string {
	if g.cfg.Breaker.Failures == 0 {
		return ""
	}
	in := g.CircuitInfo(prefiller)
	switch {
	case g.cfg.Breaker.ProbeInterval <= 0:
	case in.ProbeUp:
		return in.State.String() + " (probe up)"
	case in.Probing:
		return in.State.String() + " (probing)"
	}
	return in.State.String()
}

// CircuitLastProbe is when prefiller's open circuit was last probed (zero:
// not since it opened, or no breaker); status.CircuitStates.
func (g *Guard) CircuitLastProbe(prefiller string) time.Time {
	if g.cfg.Breaker.Failures == 0 {
		return time.Time{}
	}
	return g.CircuitInfo(prefiller).LastProbe
}
