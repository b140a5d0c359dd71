package core

import (
	"context"

	"github.com/rs/zerolog"

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

// admitting is a request's admission under way.
type admitting struct {
	// next is how far it got: the admitters run (Sidecar.admitters), then
	// one more once the prefiller is named.
	next int
	// err is the refusal a step's continuation recorded.
	err error
	// a is what the admitters work on (feature.Admission): the request's
	// state, loaded before an admitter's part runs and taken back after.
	a feature.Admission
}

// load readies the admission of r's state for an admitter's part.
func (g *admitting) load(r *Request) *feature.Admission {
	g.a = feature.Admission{API: r.API, ID: r.ID, Body: r.Body, Stream: r.Stream, Usage: r.Usage,
		Local: r.Local, Routed: r.dpRouted, Session: r.session, Client: r.Client,
		Log: r, Trace: r.trace, Encoded: r.Obs.Encoder}
	return &g.a
}

// store takes back into r what an admitter's part changed, and lets go of
// the admission, which keeps nothing of the request between parts.
func (g *admitting) store(r *Request) {
	a := &g.a
	r.Body, r.Stream, r.Usage = a.Body, a.Stream, a.Usage
	r.Local, r.dpRouted, r.session = a.Local, a.Routed, a.Session
	r.Obs.Encoder = a.Encoded
	if a.Refusal != nil {
		g.err = a.Refusal
	}
	g.a = feature.Admission{}
}

// wait is the step an admitter's part waits on, whose continuation
// finishes that part on the request as it stands once the call returned:
// the driver may have moved the body meanwhile (the lane copies it off its
// read buffer).
func (g *admitting) wait(r *Request, step feature.Step) feature.Step {
	return func(ctx context.Context) func() {
		then := step(ctx)
		return func() {
			g.load(r)
			then()
			g.store(r)
		}
	}
}

// Admit runs what comes before a request's first leg, in this order on
// both drivers: the admitters (Sidecar.admitters, feature.Admitter) on the
// request's admission, the prefiller h names checked against the
// allowlist, the request features begun, a split one of them declines,
// MoRI-IO's host specs resolved (a blocking step, when one is not yet).
// It says where the request goes from there, or which step it waits on;
// asked again once that ran, with the same head, it goes on.
func (r *Request) Admit(h feature.Head) Admission {
	as, g := r.P.admitters, &r.adm
	if g.next > len(as) { // named, after the MoRI-IO step
		return Admission{Route: RouteSplit}
	}
	for g.next < len(as) {
		if g.err != nil {
			return Admission{Err: g.err}
		}
		a := as[g.next]
		g.next++
		step, err := a.Admit(g.load(r), h)
		g.store(r)
		if err != nil {
			return Admission{Err: err}
		}
		if step != nil {
			return Admission{Wait: g.wait(r, step)}
		}
	}
	if g.err != nil {
		return Admission{Err: g.err}
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
	g.next++ // named
	if step := r.uses.PrepareStep(); step != nil {
		return Admission{Wait: step}
	}
	return Admission{Route: RouteSplit}
}
