package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Sentinel errors of the request path. Every failure is wrapped around one
// of these and mapped to a status, a fallback reason and a log message by
// classify, the one place that decides.
var (
	// ErrClientGone: the client closed its connection; upstream legs are
	// cancelled.
	ErrClientGone = errors.New("client disconnected")
	// ErrBadPrefiller: the x-prefiller-host-port value is not host:port.
	ErrBadPrefiller = errors.New("invalid x-prefiller-host-port")
	// ErrPrefillUnreachable: the prefiller refused, reset or closed the
	// connection before answering.
	ErrPrefillUnreachable = errors.New("prefiller unreachable")
	// ErrPrefillTimeout: the prefill leg did not answer within
	// --prefill-timeout (all attempts included).
	ErrPrefillTimeout = split.ErrPrefillTimeout
	// ErrPrefillOverloaded: the prefiller answered 429.
	ErrPrefillOverloaded = errors.New("prefiller overloaded (429)")
	// ErrPrefillServerError: the prefiller answered 5xx.
	ErrPrefillServerError = errors.New("prefiller server error (5xx)")
	// ErrPrefillRejected: the prefiller answered another 4xx; the request
	// itself is bad, and the answer goes back to the client verbatim.
	ErrPrefillRejected = errors.New("prefiller rejected the request (4xx)")
	// ErrTPMismatch: the prefiller's tp_size exceeds --decode-tp-size.
	ErrTPMismatch = split.ErrTPMismatch
	// ErrDecodeUnavailable: the local engine refused the connection.
	ErrDecodeUnavailable = errors.New("decode engine unavailable")
	// ErrDecodeTimeout: the local engine did not start a streamed answer
	// within --decode-first-byte-timeout.
	ErrDecodeTimeout = errors.New("decode engine did not start answering within --decode-first-byte-timeout")
	// ErrDecodeFailed: another transport failure talking to the local engine.
	ErrDecodeFailed = errors.New("decode engine failed")
	// ErrKVLoadFailed: the decode engine reported that loading the remote
	// KV failed before any token reached the client.
	ErrKVLoadFailed = errors.New("decode engine failed to load remote KV")
	// ErrUnknownRank: x-data-parallel-host-port names no data-parallel rank
	// of this pod, or is not host:port.
	ErrUnknownRank = errors.New("x-data-parallel-host-port names no data-parallel rank of this pod")
	// ErrBadRequest: the client body is not a JSON object.
	ErrBadRequest = errors.New("request body is not a JSON object")
)

// Fallback reasons, the closed set of pd_sidecar_fallbacks_total{reason}.
const (
	// ReasonUnreachable: refused, reset or closed before answering.
	ReasonUnreachable = "unreachable"
	// ReasonTimeout: no answer within --prefill-timeout.
	ReasonTimeout = "timeout"
	// ReasonServerError: the prefiller answered 5xx.
	ReasonServerError = "server_error"
	// ReasonOverloaded: the prefiller answered 429.
	ReasonOverloaded = "overloaded"
	// ReasonNoKVParams: the prefill hit its cap but carried no params.
	ReasonNoKVParams = "no_kv_params"
	// ReasonInvalidParams: the params lack what the decode engine needs.
	ReasonInvalidParams = "invalid_kv_params"
	// ReasonBadAnswer: the prefill answer is not a JSON object, or not an
	// answer the sidecar takes (upstream.ErrBadUpstreamAnswer: a status below 200, a
	// malformed head or body, a body past --max-upstream-answer-bytes).
	ReasonBadAnswer = "bad_answer"
	// ReasonTPMismatch: prefill tp_size above --decode-tp-size.
	ReasonTPMismatch = "tp_mismatch"
	// ReasonBadPrefiller: the header is not host:port.
	ReasonBadPrefiller = "invalid_prefiller"
	// ReasonKVLoadFailed: the decode engine failed to load the remote KV,
	// or the sidecar's own pull failed (checksum, size, deadline, lease).
	ReasonKVLoadFailed = "kv_load_failed"
	// ReasonKVSourceGone: the sidecar's pull found the prefiller's KV agent
	// gone (unreachable, or it broke off mid-pull).
	ReasonKVSourceGone = "kv_source_gone"
	// ReasonEOSUnsupported: EOS on the first token, streamed on an API
	// whose stream cannot be synthesised from the prefill answer.
	ReasonEOSUnsupported = "eos_stream_unsupported"
	// ReasonBootstrapFailed: the prefiller's bootstrap server (Mooncake
	// GET /query) gave no usable answer.
	ReasonBootstrapFailed = "bootstrap_failed"
	// ReasonBufferBudget: the prefill's answer (or the bootstrap's, or a
	// KV engine call's) did not fit in --max-buffered-bytes.
	ReasonBufferBudget = "buffered_bytes"
)

// outcome is what the proxy does about an error.
type outcome struct {
	// status is the HTTP status to answer with when not falling back.
	status int
	// reason is the fallback reason label ("" when the error is no reason
	// to fall back to local prefill).
	reason string
	// retry marks prefill errors worth another attempt.
	retry bool
	// retryAfter: the answer says Retry-After (a refusal for want of
	// buffer room; set by request.failure).
	retryAfter bool
}

// classify maps every request-path error to what happens next.
func classify(err error) outcome {
	switch {
	case errors.Is(err, ErrClientGone):
		return outcome{status: 499}
	case errors.Is(err, ErrPrefillerDenied), errors.Is(err, ErrKVAddressDenied):
		return outcome{status: http.StatusForbidden}
	case errors.Is(err, ErrCircuitOpen):
		return outcome{status: http.StatusServiceUnavailable, reason: ReasonCircuitOpen}
	case errors.Is(err, upstream.ErrBufferBudget):
		// An answer the budget had no room for; the upstream may be fine.
		return outcome{status: http.StatusServiceUnavailable, reason: ReasonBufferBudget}
	case errors.Is(err, ErrBadRequest), errors.Is(err, ErrUnknownRank):
		return outcome{status: http.StatusBadRequest}
	case errors.Is(err, ErrBadPrefiller):
		return outcome{status: http.StatusBadRequest, reason: ReasonBadPrefiller}
	case errors.Is(err, ErrKVWaitTimeout):
		return outcome{status: http.StatusGatewayTimeout, reason: ReasonKVWaitTimeout}
	case errors.Is(err, ErrPrefillTimeout):
		return outcome{status: http.StatusGatewayTimeout, reason: ReasonTimeout}
	case errors.Is(err, ErrPrefillUnreachable):
		return outcome{status: http.StatusBadGateway, reason: ReasonUnreachable, retry: true}
	case errors.Is(err, ErrPrefillOverloaded):
		return outcome{status: http.StatusTooManyRequests, reason: ReasonOverloaded, retry: true}
	case errors.Is(err, ErrPrefillServerError):
		return outcome{status: http.StatusBadGateway, reason: ReasonServerError, retry: true}
	case errors.Is(err, ErrPrefillRejected):
		return outcome{status: http.StatusBadRequest}
	case errors.Is(err, connectors.ErrNoKVParams):
		return outcome{status: http.StatusBadGateway, reason: ReasonNoKVParams}
	case errors.Is(err, connectors.ErrInvalidKVParams):
		return outcome{status: http.StatusBadGateway, reason: ReasonInvalidParams}
	case errors.Is(err, connectors.ErrBadPrefillAnswer):
		return outcome{status: http.StatusBadGateway, reason: ReasonBadAnswer}
	case errors.Is(err, connectors.ErrBadBody):
		return outcome{status: http.StatusBadRequest}
	case errors.Is(err, ErrTPMismatch):
		return outcome{status: http.StatusBadGateway, reason: ReasonTPMismatch}
	case errors.Is(err, ErrEOSStream):
		return outcome{status: http.StatusBadGateway, reason: ReasonEOSUnsupported}
	case errors.Is(err, kvtransfer.ErrKVSourceGone):
		return outcome{status: http.StatusBadGateway, reason: ReasonKVSourceGone}
	case errors.Is(err, ErrKVLoadFailed):
		return outcome{status: http.StatusInternalServerError, reason: ReasonKVLoadFailed}
	case errors.Is(err, connectors.ErrUnsupportedRequest):
		return outcome{status: http.StatusBadRequest}
	case errors.Is(err, ErrBootstrapFailed), errors.Is(err, connectors.ErrBadBootstrap):
		return outcome{status: http.StatusBadGateway, reason: ReasonBootstrapFailed}
	case errors.Is(err, ErrEncoderFailed):
		return outcome{status: http.StatusBadGateway}
	case errors.Is(err, ErrDecodeTimeout):
		return outcome{status: http.StatusGatewayTimeout}
	case errors.Is(err, ErrDecodeUnavailable):
		return outcome{status: http.StatusServiceUnavailable}
	}
	return outcome{status: http.StatusBadGateway}
}

// prefillTransportErr names a failed prefill exchange: the sentinel
// classify maps (the fallback reason) around an upstream.UpstreamError of the
// prefiller (or of the role err names already: its bootstrap server). An
// error named so already is returned as it is.
func prefillTransportErr(err error) error {
	var ue *upstream.UpstreamError
	named := errors.As(err, &ue)
	switch {
	case errors.Is(err, ErrClientGone):
		return err
	case named && (errors.Is(err, ErrPrefillTimeout) || errors.Is(err, ErrPrefillUnreachable) ||
		errors.Is(err, connectors.ErrBadPrefillAnswer) || errors.Is(err, upstream.ErrBufferBudget)):
		return err
	}
	u := upstreamErr(upstream.RolePrefiller, "", err)
	switch {
	case errors.Is(err, upstream.ErrBufferBudget): // no fault of the prefiller's
		return u
	case errors.Is(err, upstream.ErrBadUpstreamAnswer):
		return fmt.Errorf("%w: %w", connectors.ErrBadPrefillAnswer, u)
	case errors.Is(err, ErrPrefillTimeout), errors.Is(err, context.DeadlineExceeded) || upstream.IsTimeout(err):
		return fmt.Errorf("%w: %w", ErrPrefillTimeout, u)
	}
	return fmt.Errorf("%w: %w", ErrPrefillUnreachable, u)
}

// decodeTransportErr names a failed exchange with the local engine: the
// sentinel classify maps (the status) around an upstream.UpstreamError of the local
// engine. An error named so already is returned as it is.
func decodeTransportErr(err error) error {
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
