package godriver

import (
	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
)

// choreograph runs the request under the choreography its connector
// declares, when that is not the plain sequential handoff of ServeInference.
// It reports whether the request was served; false lets the sequential
// handoff run (always for Sequential connectors, and for DecodeFirst ones
// when the request is not tried on the decode engine first or was declined).
func choreograph(r *relay.Exchange) bool {
	if r.R.P.PairedSplit() {
		servePaired(r) // a concurrent connector, or MoRI-IO parallel dispatch
		return true
	}
	if r.R.P.Choreo == connectors.ChoreographyDecodeFirst {
		return serveDecodeFirst(r)
	}
	return false
}

// servePaired runs both legs at once (SGLang, Mooncake, the offloading
// connector, MoRI-IO's parallel dispatch): the prefill leg in the
// background, the decode leg relayed to the client, as split.Paired
// decides. The prefiller's circuit breaker is asked first, as on the
// sequential path; its bootstrap server (Mooncake's) is asked next; a
// failure of either, or legs that cannot be built, decides the request
// before any leg is sent.
func servePaired(r *relay.Exchange) {
	s := core.BeginPaired(r.R)
	if step := s.Prepare(r.R); step != nil {
		step(r.R.Ctx)()
	}
	newPaired(r, s).run(s.Start, s.Pre, s.Dec)
}
