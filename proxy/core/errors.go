package core

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Sentinel errors of the request path. Every failure is wrapped around one
// of these, or another package's sentinel, and mapped to a status, a
// fallback reason and a log message by the outcome it carries (failure.Of,
// the one place that decides).
var (
	// ErrClientGone: the client closed its connection; upstream legs are
	// cancelled.
	ErrClientGone error = failure.New("client disconnected", failure.Outcome{Status: 499, Precedence: failure.PrecedenceClientGone})
	// ErrBadPrefiller: the x-prefiller-host-port value is not host:port.
	ErrBadPrefiller error = failure.New("invalid x-prefiller-host-port", failure.Outcome{Status: http.StatusBadRequest, Reason: failure.ReasonBadPrefiller})
	// ErrPrefillUnreachable: the prefiller refused, reset or closed the
	// connection before answering.
	ErrPrefillUnreachable error = failure.New("prefiller unreachable", failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonUnreachable, Retry: true})
	// ErrPrefillOverloaded: the prefiller answered 429.
	ErrPrefillOverloaded error = failure.New("prefiller overloaded (429)", failure.Outcome{Status: http.StatusTooManyRequests, Reason: failure.ReasonOverloaded, Retry: true})
	// ErrPrefillServerError: the prefiller answered 5xx.
	ErrPrefillServerError error = failure.New("prefiller server error (5xx)", failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonServerError, Retry: true})
	// ErrPrefillWithHistory wraps the failure of a prefill whose leg asked
	// its engine to pull a conversation's history first (multi-turn KV
	// reuse): the history is taken out and the prefill sent once more
	// (split.Verdict.Plain). It carries no outcome of its own: what it
	// wraps does.
	ErrPrefillWithHistory = errors.New("prefill with the conversation's history failed")
	// ErrPrefillRejected: the prefiller answered another 4xx; the request
	// itself is bad, and the answer goes back to the client verbatim.
	ErrPrefillRejected error = failure.New("prefiller rejected the request (4xx)", failure.Outcome{Status: http.StatusBadRequest})
	// ErrDecodeUnavailable: the local engine refused the connection.
	ErrDecodeUnavailable error = failure.New("decode engine unavailable", failure.Outcome{Status: http.StatusServiceUnavailable})
	// ErrDecodeTimeout: the local engine did not start a streamed answer
	// within --decode-first-byte-timeout.
	ErrDecodeTimeout error = failure.New("decode engine did not start answering within --decode-first-byte-timeout", failure.Outcome{Status: http.StatusGatewayTimeout})
	// ErrDecodeFailed: another transport failure talking to the local engine.
	ErrDecodeFailed error = failure.New("decode engine failed", failure.Outcome{Status: http.StatusBadGateway})
	// ErrKVLoadFailed: the decode engine reported that loading the remote
	// KV failed before any token reached the client.
	ErrKVLoadFailed error = failure.New("decode engine failed to load remote KV", failure.Outcome{Status: http.StatusInternalServerError, Reason: failure.ReasonKVLoadFailed})
	// ErrBadRequest: the client body is not a JSON object, or is one that
	// decoders read differently (connectors.ErrAmbiguousJSON), or no leg
	// can be built of it.
	ErrBadRequest error = failure.New("bad request body", failure.Outcome{Status: http.StatusBadRequest})
)

// PrefillTransportErr names a failed prefill exchange: the sentinel whose
// outcome says the fallback reason, around an upstream.UpstreamError of
// the prefiller (or of the role err names already: its bootstrap server).
// An error named so already is returned as it is.
func PrefillTransportErr(err error) error {
	var ue *upstream.UpstreamError
	named := errors.As(err, &ue)
	switch {
	case errors.Is(err, ErrClientGone):
		return err
	case named && (errors.Is(err, split.ErrPrefillTimeout) || errors.Is(err, ErrPrefillUnreachable) ||
		errors.Is(err, connectors.ErrBadPrefillAnswer) || errors.Is(err, upstream.ErrBufferBudget)):
		return err
	}
	u := upstreamErr(upstream.RolePrefiller, "", err)
	switch {
	case errors.Is(err, upstream.ErrBufferBudget): // no fault of the prefiller's
		return u
	case errors.Is(err, upstream.ErrBadUpstreamAnswer):
		return fmt.Errorf("%w: %w", connectors.ErrBadPrefillAnswer, u)
	case errors.Is(err, split.ErrPrefillTimeout), errors.Is(err, context.DeadlineExceeded) || upstream.IsTimeout(err):
		return fmt.Errorf("%w: %w", split.ErrPrefillTimeout, u)
	}
	return fmt.Errorf("%w: %w", ErrPrefillUnreachable, u)
}

// DecodeTransportErr names a failed exchange with the local engine: the
// sentinel whose outcome says the status, around an
// upstream.UpstreamError of the local engine. An error named so already is returned as it is.
func DecodeTransportErr(err error) error {
	var ue *upstream.UpstreamError
	named := errors.As(err, &ue)
	switch {
	case errors.Is(err, ErrClientGone):
		return err
	case named && (errors.Is(err, ErrDecodeFailed) || errors.Is(err, ErrDecodeTimeout) || errors.Is(err, ErrDecodeUnavailable)):
		return err
	}
	u := upstreamErr(upstream.RoleEngine, "", err)
	switch {
	case errors.Is(err, ErrDecodeTimeout), errors.Is(err, upstream.ErrFirstByteTimeout):
		return fmt.Errorf("%w: %w", ErrDecodeTimeout, u)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%w: %w", ErrDecodeUnavailable, u)
	}
	return fmt.Errorf("%w: %w", ErrDecodeFailed, u)
}

// ErrDrainTimeout: requests were still in flight when --shutdown-grace ran
// out.
var ErrDrainTimeout = errors.New("shutdown grace ran out with requests in flight")

// ServerName is the Server header of every answer.
const ServerName = "pd-sidecar"
