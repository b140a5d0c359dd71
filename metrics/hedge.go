package metrics

import "github.com/prometheus/client_golang/prometheus"

// Hedge winners (the winner label of hedges_total).
const (
	// HedgeRemote: the prefill answered first; the local prefill raced
	// against it was cancelled.
	HedgeRemote = "remote"
	// HedgeLocal: the local prefill produced its first output first; the
	// prefill leg was cancelled (its connection closed).
	HedgeLocal = "local"
)

// Hedge holds the collectors of hedged prefill (--prefill-hedge-after).
type Hedge struct {
	// Hedges counts local prefills raced against a slow prefill, by winner.
	Hedges *prometheus.CounterVec
	// Denied counts prefills past the hedge point that the hedge budget
	// did not let hedge.
	Denied prometheus.Counter
	// Wasted sums the time the losing leg of each hedge ran before it was
	// cancelled, by leg: the work a hedge cost.
	Wasted *prometheus.CounterVec
}

// NewHedge creates the hedged-prefill collectors and registers them on reg.
func NewHedge(reg prometheus.Registerer) *Hedge {
	h := &Hedge{
		Hedges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_hedges_total",
			Help: "Local prefills raced against a prefill that had not answered by the hedge point, by winner (remote: the prefill answered first; local: the local prefill's first output came first).",
		}, []string{"winner"}),
		Denied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pd_sidecar_hedges_denied_total",
			Help: "Prefills past the hedge point that were not hedged because the hedge budget (--prefill-hedge-budget) was spent.",
		}),
		Wasted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_hedge_wasted_seconds_total",
			Help: "Time the losing leg of each hedge ran before it was cancelled, by leg (remote: the prefill; local: the local prefill).",
		}, []string{"leg"}),
	}
	reg.MustRegister(h.Hedges, h.Denied, h.Wasted)
	for _, w := range []string{HedgeRemote, HedgeLocal} {
		h.Hedges.WithLabelValues(w)
		h.Wasted.WithLabelValues(w)
	}
	return h
}
