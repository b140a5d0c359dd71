// Package failure says what the sidecar does about a failure: the status
// it answers with (and whether the answer says Retry-After), the reason it
// falls back to a local prefill for, and whether a prefill is worth
// another attempt. An error carries its outcome
// itself (an *Error, made where the failure is defined), so the one
// classifier, Of, knows no feature: it reads the outcome off the error.
package failure

import "net/http"

// Outcome is what the sidecar does about a failure.
type Outcome struct {
	// Status is the HTTP status answered when the request does not fall
	// back (or cannot).
	Status int
	// Reason is the fallback reason, pd_sidecar_fallbacks_total{reason}:
	// "" when the failure is no reason to fall back to a local prefill.
	Reason string
	// Retry marks a prefill failure worth another attempt.
	Retry bool
	// RetryAfter: the answer says Retry-After: 1 (a refusal for want of
	// room, which a client may try again shortly).
	RetryAfter bool
	// Precedence orders outcomes found in one error: the highest wins
	// wherever it stands (a client that left, the sidecar's own refusals);
	// among equals, the outermost, which the code that knew most about the
	// failure wrapped last.
	Precedence int
}

// Default is the outcome of an error that carries none: a 502.
var Default = Outcome{Status: http.StatusBadGateway}

// Error is a sentinel error with its outcome.
type Error struct {
	msg string
	out Outcome
}

// New returns a sentinel error saying msg, whose outcome is o.
func New(msg string, o Outcome) *Error { return &Error{msg: msg, out: o} }

// Error implements error.
func (e *Error) Error() string { return e.msg }

// Outcome is the error's outcome.
func (e *Error) Outcome() Outcome { return e.out }

// Of is the outcome of err: of the errors in its tree (errors.Unwrap's,
// both kinds) that carry one (an *Error), the one of the highest
// Precedence, the outermost of those in depth-first order; Default when
// none does.
func Of(err error) Outcome {
	best, found := Default, false
	walk(err, func(e error) {
		if e, ok := e.(*Error); ok && (!found || e.out.Precedence > best.Precedence) {
			best, found = e.out, true
		}
	})
	return best
}

// walk visits err's tree depth-first, each error before what it wraps.
func walk(err error, visit func(error)) {
	for err != nil {
		visit(err)
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e, visit)
			}
			return
		default:
			return
		}
	}
}
