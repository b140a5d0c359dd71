package inference

import (
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// Route is where Admit sends a request.
type Route int

const (
	// RouteFail: the request is refused; the error is its answer.
	RouteFail Route = iota
	// RouteLocal: served on the local engine, no prefiller prefilling
	// it (none named, or a request feature declined the split).
	RouteLocal
	// RouteSplit: split with the prefiller it names (Request.Prefiller).
	RouteSplit
	// RouteFallback: the prefiller it names is refused (not allowed, or
	// malformed); the error is the reason to fall back (split.Refused).
	RouteFallback
)

// Admission is where Admit sends a request: its Route (Err: a refusal's
// answer, or a fallback's cause), or Wait, a blocking step its admission
// waits on, which the driver runs (feature.Step) before it asks Admit
// again.
type Admission struct {
	Route Route
	Err   error
	Wait  feature.Step
}

// admitter is a part of every inference request's admission, before its
// prefiller is named: on the request and its head h (which it must not
// keep). An error refuses the request (its outcome is the answer); a
// returned step is a blocking call the admission waits on, whose
// continuation finishes the admitter's part (an error it records in
// Request.admitErr refuses the request) before the next admitter runs.
// New registers the admitters that are on, in their order, in
// Proxy.admitters: the data-parallel rank (rankPicker), sanitize
// (sanitizer), the session key (sessionReader), the encoder stage
// (encoderStage).
type admitter interface {
	admit(r *Request, h *fasthttp.RequestHeader) (feature.Step, error)
}

// Admit runs what comes before a request's first leg, in this order on
// both drivers: the admitters (Proxy.admitters), the prefiller h names
// checked against the allowlist, the request features begun, a split one
// of them declines, MoRI-IO's host specs resolved (a blocking step, when
// one is not yet). It says where the request goes from there, or which
// step it waits on; asked again once that ran, with the same head, it
// goes on.
func (r *Request) Admit(h *fasthttp.RequestHeader) Admission {
	as := r.P.admitters
	if r.admitted > len(as) { // named, after the MoRI-IO step
		return Admission{Route: RouteSplit}
	}
	for r.admitted < len(as) {
		if err := r.admitErr; err != nil {
			return Admission{Err: err}
		}
		a := as[r.admitted]
		r.admitted++
		step, err := a.admit(r, h)
		if err != nil {
			return Admission{Err: err}
		}
		if step != nil {
			return Admission{Wait: step}
		}
	}
	if err := r.admitErr; err != nil {
		return Admission{Err: err}
	}
	hv := h.Peek(HeaderPrefiller)
	if len(hv) == 0 {
		r.LogAt(zerolog.DebugLevel).Msg("no prefiller named: local")
		r.beginFeatures(h, false)
		return Admission{Route: RouteLocal}
	}
	if err := r.namePrefiller(hv); err != nil {
		r.beginFeatures(h, true)
		return Admission{Route: RouteFallback, Err: err}
	}
	r.beginFeatures(h, false)
	if r.uses.Declined() {
		return Admission{Route: RouteLocal}
	}
	r.admitted++ // named
	if step := r.P.moriResolveStep(r); step != nil {
		return Admission{Wait: step}
	}
	return Admission{Route: RouteSplit}
}
