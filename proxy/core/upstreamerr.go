package core

import (
	"errors"
	"io"

	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Every failed exchange reaches the request path as an
// upstream.UpstreamError, made where the role is known
// (prefillTransportErr, decodeTransportErr, the bootstrap query, an
// encoder leg, a KV engine call), wrapped by the sentinel whose outcome counts
// (ErrDecodeFailed, ErrPrefillUnreachable...); a parser's error is already
// fixed words (upstream.BadAnswer, and the lane's rawhttp.Answer). The text of
// the chain is then fixed words all the way down, and clientMessage, which
// every error answer's message comes from, says it.

// upstreamErr returns err, a failed exchange with an upstream of role at
// addr (the upstream.LegError's address in err when it has one), as an
// upstream.UpstreamError; an err that already holds one is returned as it is.
func upstreamErr(role upstream.Role, addr string, err error) error {
	var ue *upstream.UpstreamError
	if errors.As(err, &ue) {
		return err
	}
	var le *upstream.LegError
	if errors.As(err, &le) {
		addr = le.Addr
	}
	return &upstream.UpstreamError{Role: role, Reason: reasonOf(err), Addr: addr, Err: err}
}

// reasonOf says in fixed words why an exchange with an upstream failed:
// upstream.ReasonOf, and the request path's own failures (an SSE event
// past its bound, the prefill timeout) in the same order of precedence.
// An encoder leg's failures are named by encoder.Stage.
func reasonOf(err error) string {
	switch {
	case errors.Is(err, upstream.ErrBadUpstreamAnswer):
		return upstream.ReasonOf(err)
	case errors.Is(err, sse.ErrEventTooLong):
		return "answer refused: an SSE event longer than --max-sse-event-bytes"
	case errors.Is(err, upstream.ErrBufferBudget):
		return upstream.ReasonOf(err)
	case errors.Is(err, split.ErrPrefillTimeout):
		return "timed out"
	}
	return upstream.ReasonOf(err)
}

// EndedEarly is the local engine's stream at addr that ended before what
// (its first event, its first output) for the reason err (io.EOF or nil:
// it ended cleanly, too soon).
func EndedEarly(addr, what string, err error) error {
	why := "stream ended before " + what
	if err != nil && !errors.Is(err, io.EOF) {
		why += " (" + reasonOf(err) + ")"
	}
	var le *upstream.LegError
	if errors.As(err, &le) {
		addr = le.Addr
	}
	return &upstream.UpstreamError{Role: upstream.RoleEngine, Reason: why, Addr: addr, Err: err}
}

// clientMessage is what an error answer says of err: its text, which on
// the request path is fixed words (the sentinels, the sidecar's own
// wrapping, an upstream.UpstreamError's role and reason; never an upstream's bytes
// or address).
func clientMessage(err error) string { return err.Error() }
