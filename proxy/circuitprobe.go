package proxy

import (
	"time"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/circuitprobe"
)

// newCircuitProber returns a prober of g's breakers, or nil when probing is
// off (--circuit-probe-interval 0, or no breaker); each connect is bounded
// by connectTimeout too (circuitprobe.New).
func newCircuitProber(g *guard, connectTimeout time.Duration) *circuitprobe.Prober {
	b := g.cfg.Breaker
	if b.Failures == 0 || b.ProbeInterval <= 0 {
		return nil
	}
	return circuitprobe.New(g, b.ProbeInterval, connectTimeout)
}

// ProbeList lists the open circuits a connect probe may end
// (circuitprobe.Targets).
func (g *guard) ProbeList(limit int) []string { return g.breakers.Probes(limit) }

// Probed records a probe's result on hp's breaker, counts it, and keeps
// the open-circuits gauge current (circuitprobe.Targets). A probe that
// found hp up leaves the circuit open with its cool-down ended, rather
// than closing it: the next request to hp is the half-open trial and is
// split at once, as it would be on a closed circuit, while a prefiller
// that accepts connections but cannot serve costs one failed trial, not
// --circuit-breaker-failures of them.
func (g *guard) Probed(hp string, up bool) {
	g.breakers.Probed(hp, up)
	result := metrics.ProbeDown
	if up {
		result = metrics.ProbeUp
	}
	g.m.CircuitProbes.WithLabelValues(result).Inc()
	g.trackCircuit(hp)
}

var (
	_ background           = (*circuitprobe.Prober)(nil)
	_ circuitprobe.Targets = (*guard)(nil)
)
