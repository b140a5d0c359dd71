package core

import (
	"time"

	"github.com/pd-sidecar/pd-sidecar/proxy/circuitprobe"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
)

// newCircuitProber returns a prober of g's breakers, or nil when probing is
// off (--circuit-probe-interval 0, or no breaker); each connect is bounded
// by connectTimeout too (circuitprobe.New).
func newCircuitProber(g *guard.Guard, connectTimeout time.Duration) *circuitprobe.Prober {
	b := g.Config().Breaker
	if b.Failures == 0 || b.ProbeInterval <= 0 {
		return nil
	}
	return circuitprobe.New(g, b.ProbeInterval, connectTimeout)
}

var _ Background = (*circuitprobe.Prober)(nil)
