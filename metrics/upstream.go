package metrics

import "github.com/prometheus/client_golang/prometheus"

// Upstreams whose answers the sidecar refuses (the upstream label of
// upstream_refused_total).
const (
	// UpstreamEngine: the local engine (a decode leg, a local request).
	UpstreamEngine = "engine"
	// UpstreamPrefiller: a prefill engine.
	UpstreamPrefiller = "prefiller"
)

// Reasons an upstream's answer is refused (the reason label of
// upstream_refused_total).
const (
	// RefusedEventTooLong: an SSE event of the answer's stream ran past
	// --max-sse-event-bytes.
	RefusedEventTooLong = "event_too_long"
)

// upstreamRefusals are the upstream and reason pairs that can occur, each
// exported at 0 from the start.
var upstreamRefusals = [][2]string{
	{UpstreamEngine, RefusedEventTooLong},
}

// Upstream holds the collectors of what the sidecar refuses in upstream
// answers.
type Upstream struct {
	// Refused counts upstream answers the sidecar stopped reading and
	// refused, by upstream (UpstreamEngine, UpstreamPrefiller) and reason
	// (RefusedEventTooLong).
	Refused *prometheus.CounterVec
}

// NewUpstream creates the upstream collectors and registers them on reg.
func NewUpstream(reg prometheus.Registerer) *Upstream {
	u := &Upstream{
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_upstream_refused_total",
			Help: "Upstream answers the sidecar stopped reading and refused (the upstream connection closed), by upstream (engine, prefiller) and reason (event_too_long: an SSE event past --max-sse-event-bytes).",
		}, []string{"upstream", "reason"}),
	}
	reg.MustRegister(u.Refused)
	for _, p := range upstreamRefusals {
		u.Refused.WithLabelValues(p[0], p[1])
	}
	return u
}
