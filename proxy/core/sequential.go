package core

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Sequential is a request's side of its sequential split (split.Sequential),
// which both drivers ask the same things of: the legs' bodies, how the
// split begins (the hedge point, the prefiller's breaker, whose ticket it
// keeps), what the prefill's answer says, the step that takes the handoff
// on, and the machine's accounting. A driver keeps it as a value in its
// split's state (BeginSequential).
type Sequential struct {
	r  *Request
	tk *circuit.Ticket // the prefiller's breaker, while the prefill runs
	// handoff is the one the decode leg carries (the request's Handoff
	// from DecodeBody on).
	handoff connectors.Handoff
}

// BeginSequential is request r's side of its sequential split.
func BeginSequential(r *Request) Sequential { return Sequential{r: r} }

// PrefillBody builds the sequential prefill leg's body, appended to dst:
// the connector's, with MoRI-IO's fields when they apply, as the request
// features edit it. An error is the client's (ErrBadRequest).
func (s *Sequential) PrefillBody(dst []byte) ([]byte, error) {
	r := s.r
	p := r.P
	body, err := p.seq.PrefillBody(dst, r.API, r.Body)
	if err == nil {
		body, err = r.uses.EditPrefill(body)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return body, nil
}

// DecodeBody builds the sequential decode leg's body from the prefill's
// handoff h, appended to dst: the request features' edits of its
// kv_transfer_params (MoRI-IO's rank and fields), then the connector's;
// the request carries h from here, disaggregated. An edit that failed is
// a failure marked for a local prefill to recover from.
func (s *Sequential) DecodeBody(dst []byte, h connectors.Handoff) (body []byte, err error) {
	r := s.r
	p := r.P
	if h.Params, err = r.uses.EditDecodeParams(h.Params); err != nil {
		return nil, split.Recoverable(err) // MoRI-IO's fields that could not be written
	}
	if body, err = p.seq.DecodeBody(dst, r.API, r.Body, h); err != nil {
		return nil, err
	}
	s.handoff = h
	r.Mode, r.Handoff = metrics.ModeDisaggregated, &s.handoff
	return body, nil
}

// PrefillBegan records a prefill attempt sent at start: the request is
// disaggregated from here; the returned func records its end.
func (s *Sequential) PrefillBegan(start time.Time) func(error) {
	s.r.Mode = metrics.ModeDisaggregated
	return s.r.PrefillStarted(start)
}

// Local records the fallback's local leg: the request carries no handoff.
func (s *Sequential) Local() { s.r.Handoff = nil }

// Start is how the request's sequential split begins: its hedge point,
// when it may be hedged, and the prefiller's circuit breaker asked for the
// prefill, unless bodyErr says its body could not be built. sends: the
// breaker let the prefill go (its ticket is kept until the machine reports
// the outcome); else start.NoPrefill says why not.
func (s *Sequential) Start(bodyErr error) (start split.Start, sends bool) {
	r, p := s.r, s.r.P
	// Every split refills the hedge budget, hedged or not.
	if after, ok := p.hedge.Split(r.Label); ok && p.hedgeable() {
		start.HedgeAfter, start.TakeHedge = after, p.hedge.Take
	}
	if bodyErr != nil {
		start.NoPrefill = bodyErr
		return start, false
	}
	tk, err := p.Guard.AllowPrefill(r.Prefiller)
	start.NoPrefill, s.tk = err, tk
	return start, tk != nil
}

// PrefillAnswered is what a prefill answer of status, contentType and body
// (the caller's to give) says: the handoff, or why there is none.
func (s *Sequential) PrefillAnswered(status int, contentType, body []byte) (PrefillResult, error) {
	r := s.r
	switch {
	case status == http.StatusTooManyRequests:
		return PrefillResult{}, ErrPrefillOverloaded
	case status >= 500:
		err := fmt.Errorf("%w: status %d", ErrPrefillServerError, status)
		if r.uses.DropOptionalPrefill() {
			err = fmt.Errorf("%w: %w", ErrPrefillWithHistory, err)
		}
		return PrefillResult{}, err
	case status != http.StatusOK && status < 400:
		// A 204, a 304...: no prefill answer, and nothing for the client.
		return PrefillResult{}, fmt.Errorf("%w: %w: status %d", connectors.ErrBadPrefillAnswer, upstream.ErrBadUpstreamAnswer, status)
	case status != http.StatusOK:
		return PrefillResult{}, &Rejected{Status: status, ContentType: string(contentType), Body: body}
	}
	h, err := r.P.seq.ParsePrefill(r.API, body)
	if err == nil {
		h, err = r.P.checkHandoff(r.Prefiller, h) // its addresses against the allowlist
	}
	if err != nil {
		h = connectors.Handoff{} // nothing of a refused answer goes on
		err = r.P.withGeneration(err, body)
	}
	awaitKVRead(r, h, err) // only a checked handoff is released
	return PrefillResult{Handoff: h, body: body}, err
}

// PrefillAnswer is the whole answer of a request whose generation ended on
// the prefill's first token: the prefill's answer without its
// kv_transfer_params, as a stream when the client streams (ErrEOSStream
// for an API whose stream cannot be synthesised).
func (s *Sequential) PrefillAnswer(res PrefillResult) (status int, contentType string, body []byte, err error) {
	r := s.r
	r.LogAt(zerolog.InfoLevel).Msg("generation ended on the first token: answered from the prefill, no decode leg")
	ans, err := connectors.EditObject(nil, res.body, []connectors.Edit{{Key: "kv_transfer_params", Delete: true}})
	if err != nil {
		ans = res.body
	}
	if !r.Stream {
		return http.StatusOK, "application/json", ans, nil
	}
	sse, ok := connectors.AnswerAsSSE(nil, r.API, ans, r.Usage)
	if !ok {
		return 0, "", nil, ErrEOSStream
	}
	return http.StatusOK, "text/event-stream", sse, nil
}

// StepsHandoff reports whether a request feature takes the split's
// handoff on its way to the decode leg (HandoffStep is then not nil): a
// driver asks first, so that a split without one builds no continuation.
func (s *Sequential) StepsHandoff() bool { return s.r.uses.HandoffStepper() != nil }

// HandoffStep is the step a request feature takes the split's handoff h
// with on its way to the decode leg (feature.HandoffStepper: the sidecar's
// own KV pull, --kv-connector sidecar); nil when none does. done goes on
// with the decode leg's handoff, or with what the step's failure is to the
// split (handoffFailure).
func (s *Sequential) HandoffStep(h connectors.Handoff, done func(connectors.Handoff, error)) feature.Step {
	st := s.r.uses.HandoffStepper()
	if st == nil {
		return nil
	}
	return st.HandoffStep(h, func(hh connectors.Handoff, err error) {
		if err != nil {
			err = s.handoffFailure(err)
		}
		done(hh, err)
	})
}

// handoffFailure says what the failure of a handoff's step is to the
// split: a client that left is only that; a KV load failure is re-run
// locally, marked Recoverable, as --on-kv-load-failure says, or answered;
// any other (the KV's source gone, its descriptor refused) is the
// prefiller's fault, marked Recoverable to degrade.
func (s *Sequential) handoffFailure(err error) error {
	r := s.r
	var kl *feature.KVLoadError
	load := errors.As(err, &kl)
	switch {
	case r.Gone():
		if load {
			err = kl.Err
		}
		return fmt.Errorf("%w: %w", ErrClientGone, err)
	case !load:
		return split.Recoverable(err)
	}
	err = fmt.Errorf("%w: sidecar pull: %w", ErrKVLoadFailed, kl.Err)
	if !r.kvLoadRerun() {
		return err
	}
	return split.Recoverable(err)
}

// Account does an accounting action of the split: the breaker's outcome
// reported with the ticket it keeps (once), any other the request's
// (Request.Account).
func (s *Sequential) Account(a split.Action) {
	if a.Op != split.BreakerDone {
		s.r.Account(a)
		return
	}
	s.r.P.Guard.BreakerDone(s.r.Prefiller, s.tk, a.Err)
	s.tk = nil
}
