package dprank

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// Header is llm-d's deprecated rank selector. It never reaches an engine:
// every leg and passthrough request drops it.
const Header = "x-data-parallel-host-port"

// Picker is the admitter that picks a request's data-parallel rank, first
// of all, before anything else reads the request: one whose Header names
// one of Pod's ranks is decoded by that rank's engine; its prefill leg, if
// any, is unchanged.
type Picker struct {
	Pod Pod
	// Engines are the local engines' addresses, by rank.
	Engines []string
	// Rejected counts the requests refused before any leg, by reason
	// (metrics.RejectUnknownRank).
	Rejected *prometheus.CounterVec
}

// Admit points a's decode legs at the rank its Header names (none: a's
// own rank). An unknown value is counted and refuses the request
// (ErrUnknown).
func (p Picker) Admit(a *feature.Admission, h feature.Head) (feature.Step, error) {
	v := h.Peek(Header)
	if v == nil {
		return nil, nil
	}
	rank, err := p.Pod.Rank(v)
	if err != nil {
		p.Rejected.WithLabelValues(metrics.RejectUnknownRank).Inc()
		return nil, err
	}
	local := p.Engines[rank]
	if local != a.Local {
		a.Log.LogAt(zerolog.DebugLevel).Str("engine", local).Msg("x-data-parallel-host-port: decoded by another rank's engine")
	}
	a.Local, a.Routed = local, true
	return nil, nil
}
