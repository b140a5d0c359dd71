package metrics

import "github.com/prometheus/client_golang/prometheus"

// Prewarm results (the result label of prewarms_total).
const (
	// PrewarmOK: the warm-up split ran, prefill and decode both answered.
	PrewarmOK = "ok"
	// PrewarmFailed: the warm-up split was sent and one of its legs failed.
	PrewarmFailed = "failed"
	// PrewarmSkipped: a new prefiller was seen but no warm-up was sent (the
	// warm-up queue was full, or the address is the sidecar's own).
	PrewarmSkipped = "skipped"
)

// NewPrewarms creates pd_sidecar_prewarms_total{result} (--prefill-prewarm)
// and registers it on reg, every result exported from the start.
func NewPrewarms(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pd_sidecar_prewarms_total",
		Help: "Warm-up splits to newly seen prefillers (--prefill-prewarm), by result (ok, failed, skipped); never counted as requests.",
	}, []string{"result"})
	reg.MustRegister(c)
	for _, r := range []string{PrewarmOK, PrewarmFailed, PrewarmSkipped} {
		c.WithLabelValues(r)
	}
	return c
}
