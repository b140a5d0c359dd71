package metrics

import "github.com/prometheus/client_golang/prometheus"

// PoolWatch holds the collectors of the SSRF allowlist's InferencePool
// watch (--enable-ssrf-protection --inference-pool): what it sees, and
// whether it is still seeing it.
type PoolWatch struct {
	// Events counts the watch events handled, by resource (inferencepools,
	// pods): each rebuilds the allowlist.
	Events *prometheus.CounterVec
	// Allowed is the number of host:port pairs the pool admits now.
	Allowed prometheus.Gauge
	// PoolFound is 1 while the pool exists, 0 while it does not (no
	// prefiller is admitted from it then: fail closed).
	PoolFound prometheus.Gauge
}

// NewPoolWatch creates the pool watch's collectors and registers them on
// reg.
func NewPoolWatch(reg prometheus.Registerer) *PoolWatch {
	w := &PoolWatch{
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_inference_pool_events_total",
			Help: "InferencePool watch events handled by the SSRF allowlist, by resource (inferencepools, pods); each rebuilds the allowlist.",
		}, []string{"resource"}),
		Allowed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pd_sidecar_inference_pool_allowed",
			Help: "host:port pairs the InferencePool admits now (its Ready pods on its target ports).",
		}),
		PoolFound: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pd_sidecar_inference_pool_found",
			Help: "1 while the watched InferencePool exists; 0 while it does not (no prefiller admitted from it: fail closed).",
		}),
	}
	reg.MustRegister(w.Events, w.Allowed, w.PoolFound)
	for _, r := range []string{"inferencepools", "pods"} {
		w.Events.WithLabelValues(r)
	}
	return w
}

// Event implements ssrf.WatchObserver.
func (w *PoolWatch) Event(resource string) { w.Events.WithLabelValues(resource).Inc() }

// Allowlist implements ssrf.WatchObserver.
func (w *PoolWatch) Allowlist(allowed int, poolFound bool) {
	w.Allowed.Set(float64(allowed))
	if poolFound {
		w.PoolFound.Set(1)
	} else {
		w.PoolFound.Set(0)
	}
}
