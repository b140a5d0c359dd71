package core

import (
	"errors"
	"net/http"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// Sentinel errors of the request guards (each with its outcome; those of a
// prefiller refused are the guard's verdicts, guard.ErrPrefillerDenied and
// guard.ErrCircuitOpen).
var (
	// ErrOverloaded: --max-concurrent-requests inference requests are in
	// flight (503, with Retry-After).
	ErrOverloaded error = failure.New("too many concurrent requests", failure.Outcome{Status: http.StatusServiceUnavailable, RetryAfter: true})
	// ErrBodyTooLarge: the request body exceeds --max-request-body-bytes (413).
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrHeadersTooLarge: the request head exceeds --max-header-bytes (431).
	ErrHeadersTooLarge = errors.New("request headers too large")
	// ErrReadTimeout: the request was not read within --read-timeout (408).
	ErrReadTimeout = errors.New("request not read in time")
	// ErrMalformed: the request could not be parsed as HTTP/1.1 (400).
	ErrMalformed = errors.New("malformed request")
)

// newGuard returns the guard of cfg, whose request bodies are at most
// maxBody bytes (--max-request-body-bytes), counted in m, its circuit
// breakers told the outcomes of prefills by breakerResult.
func newGuard(cfg guard.Config, maxBody int, m *metrics.Guards, log zerolog.Logger) (*guard.Guard, error) {
	return guard.New(cfg, guard.Deps{MaxBody: maxBody, Metrics: m, BreakerResult: breakerResult, Log: log})
}

// breakerResult is what a prefill outcome says about the prefiller's
// health (guard.Deps.BreakerResult): refused or reset (unreachable), timed
// out or 5xx is a failure; a client leaving says nothing; any answer shows
// it alive.
func breakerResult(err error) circuit.Result {
	switch {
	case err == nil:
		return circuit.Success
	case errors.Is(err, ErrClientGone), errors.Is(err, ErrBadRequest), errors.Is(err, split.ErrHedgeLost), errors.Is(err, split.ErrAbandoned):
		return circuit.Neutral
	case errors.Is(err, ErrPrefillUnreachable):
		return circuit.Unreachable // a connect probe can tell when it ends
	case errors.Is(err, split.ErrPrefillTimeout), errors.Is(err, ErrPrefillServerError):
		return circuit.Failure
	}
	return circuit.Success
}
