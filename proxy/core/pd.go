package core

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Degraded counts and logs a request degraded to a local prefill for
// reason (cause: why): the request is a fallback from here.
func (r *Request) Degraded(reason string, cause error) {
	r.P.M.Fallbacks.WithLabelValues(reason).Inc()
	r.Obs.Reason = reason
	r.Mode = metrics.ModeFallback
	if reason == failure.ReasonSlowPrefill {
		r.LogAt(zerolog.WarnLevel).Str("reason", reason).
			Msg("hedge: the local prefill was ready first; prefill cancelled, answered locally")
		return
	}
	e := upstream.WithUpstream(r.LogAt(zerolog.WarnLevel).Err(cause), cause).Str("reason", reason)
	if ge := (*KVGenerationError)(nil); errors.As(cause, &ge) {
		e = e.Str("kv_params", ge.Generation)
	}
	e.Msg("degrading to local prefill")
}

// Rejection is the prefiller's rejection err carries, logged as passed on
// to the client (nil: err is no rejection, and is answered as a failure).
// Both drivers answer it as it came.
func (r *Request) Rejection(err error) *Rejected {
	var rej *Rejected
	if !errors.As(err, &rej) {
		return nil
	}
	r.LogAt(zerolog.InfoLevel).Int("status", rej.Status).Msg("prefiller rejected the request; answer passed on")
	return rej
}

// FailureAnswered is the answer to a request that failed: its outcome's
// status, an OpenAI-style error body saying why, and whether it says
// Retry-After.
type FailureAnswered struct {
	Status     int
	Body       []byte
	RetryAfter bool
}

// LeftBeforeAnswer records a client that left before its answer began:
// counted 499, logged. The driver answers nothing.
func (r *Request) LeftBeforeAnswer(err error) {
	r.LogAt(zerolog.InfoLevel).Err(err).Msg("client left; upstream legs cancelled")
	r.P.M.ClientDisconnects.WithLabelValues(r.Phase()).Inc()
	r.P.M.Requests.WithLabelValues(r.Mode, "499").Inc()
	r.Obs.Status = 499
}

// Failure is the answer to the request's failure err, which it classifies,
// counts and logs: both drivers answer a failure with it.
func (r *Request) Failure(err error) FailureAnswered {
	o := failure.Of(err)
	upstream.WithUpstream(r.LogAt(zerolog.ErrorLevel).Err(err), err).Int("status", o.Status).Msg("request failed")
	if errors.Is(err, upstream.ErrBufferBudget) {
		// Refused for want of buffer room, as a request body is: counted
		// with those.
		r.P.M.Guards.Rejected.WithLabelValues(metrics.RejectBufferedBytes).Inc()
	}
	return FailureAnswered{Status: o.Status, Body: ErrorBody(o.Status, err), RetryAfter: o.RetryAfter}
}

func (r *Request) Phase() string {
	switch {
	case r.Handoff != nil:
		return metrics.PhaseDecode
	case r.Prefiller != "" && r.Mode == metrics.ModeDisaggregated:
		return metrics.PhasePrefill
	}
	return metrics.PhaseLocal
}

// AnswerCounted records a complete answer of status written now: its TTFT
// when it is no error, the request counter, the report's status.
func (r *Request) AnswerCounted(mode string, status int) {
	if status < 400 {
		r.P.M.TTFT.WithLabelValues(mode).Observe(time.Since(r.Start).Seconds())
	}
	r.P.M.Requests.WithLabelValues(mode, StatusLabel(status)).Inc()
	r.Obs.Status = status
}

// ErrEOSStream: generation ended on the prefill's first token but the
// client streamed an API whose stream the proxy cannot synthesise.
var ErrEOSStream error = failure.New("first-token EOS on an API whose stream cannot be synthesised", failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonEOSUnsupported})

// PrefillResult is a successful prefill exchange.
type PrefillResult struct {
	Handoff connectors.Handoff
	body    []byte
}

// Rejected is a prefill 4xx, answered to the client verbatim.
type Rejected struct {
	Status      int
	ContentType string
	Body        []byte
}

func (e *Rejected) Error() string { return fmt.Sprintf("prefiller answered %d", e.Status) }
func (e *Rejected) Unwrap() error { return ErrPrefillRejected }

// errorType names status in the one vocabulary of every error body the
// sidecar writes: OpenAI's client error classes, as vLLM's own error bodies
// use them (BadRequestError, NotFoundError, InternalServerError...), and
// the same PascalCase "...Error" shape for the statuses they lack.
func errorType(status int) string {
	switch status {
	case 400:
		return "BadRequestError"
	case 401:
		return "AuthenticationError"
	case 403:
		return "PermissionDeniedError"
	case 404:
		return "NotFoundError"
	case 405:
		return "MethodNotAllowedError"
	case 408:
		return "RequestTimeoutError"
	case 409:
		return "ConflictError"
	case 413:
		return "RequestTooLargeError"
	case 422:
		return "UnprocessableEntityError"
	case 429:
		return "RateLimitError"
	case 431:
		return "RequestHeaderFieldsTooLargeError"
	case 499:
		return "ClientClosedRequestError"
	case 501:
		return "NotImplementedError"
	case 502:
		return "BadGatewayError"
	case 503:
		return "ServiceUnavailableError"
	case 504:
		return "GatewayTimeoutError"
	case 505:
		return "HTTPVersionNotSupportedError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

// ErrorBody is an OpenAI-style error object, saying clientMessage(err).
func ErrorBody(status int, err error) []byte {
	b := []byte(`{"error":{"message":`)
	b = appendJSONString(b, clientMessage(err))
	b = append(b, `,"type":`...)
	b = appendJSONString(b, errorType(status))
	b = append(b, `,"param":null,"code":`...)
	b = fmt.Appendf(b, "%d}}", status)
	return b
}

// StreamBegan counts the request's streamed answer, of status, as it
// begins (its first output, or its first event, reaches the client).
func (r *Request) StreamBegan(status int) {
	r.P.M.Requests.WithLabelValues(r.Mode, StatusLabel(status)).Inc()
	r.Obs.Status = status
}

// FailureBody is ErrorBody of err with the status of its outcome.
func FailureBody(err error) []byte { return ErrorBody(failure.Of(err).Status, err) }

// JSONAnswered records a JSON answer of status st relayed whole, as both
// the fasthttp path and the lane relay one.
func (r *Request) JSONAnswered(st int) {
	r.P.M.TTFT.WithLabelValues(r.Mode).Observe(time.Since(r.Start).Seconds())
	r.P.M.Requests.WithLabelValues(r.Mode, StatusLabel(st)).Inc()
	r.Obs.Status = st
	r.LogAt(zerolog.InfoLevel).Str("mode", r.Mode).Int("status", st).Msg("answered")
}

// FirstByteBound is how long the local engine may take to begin the
// answer of a leg it streams: --decode-first-byte-timeout for a streamed
// request; 0 (no bound) otherwise, and when unset.
func (r *Request) FirstByteBound() time.Duration {
	if !r.Stream {
		return 0
	}
	return r.P.Cfg.DecodeFirstByteTimeout
}

// FirstByteTimedOut is the failure of a leg whose streamed answer did not
// begin within FirstByteBound.
func (r *Request) FirstByteTimedOut() error {
	return fmt.Errorf("%w: %w after %v", ErrDecodeTimeout, upstream.ErrFirstByteTimeout, r.P.Cfg.DecodeFirstByteTimeout)
}

// KVAnswered ends the KV handoff on the decode leg's answer, read whole,
// of status. It returns the failure to recover from when the decode
// engine failed to load the KV (a 500) and --on-kv-load-failure re-runs
// the request with a local prefill; nil when the answer is relayed as it
// is.
func (r *Request) KVAnswered(sent time.Time, status int) error {
	r.KVHandoffDone(sent, status == http.StatusOK)
	if status != http.StatusInternalServerError {
		return nil
	}
	return r.kvLoadFailed()
}

// KVStreamed ends the KV handoff on the decode leg's stream, read to its
// first output (errorEvent: to an error event before any). It returns
// what KVAnswered does of a KV load failure: an error event there is one.
func (r *Request) KVStreamed(sent time.Time, errorEvent bool) error {
	r.KVHandoffDone(sent, !errorEvent)
	if !errorEvent {
		return nil
	}
	return r.kvLoadFailed()
}

// kvLoadFailed counts a KV load failure of the decode leg and returns it
// marked for the split to recover from, the request's handoff let go (the
// decode engine read none of it); nil under --on-kv-load-failure error,
// which passes the engine's answer on.
func (r *Request) kvLoadFailed() error {
	if !r.kvLoadRerun() {
		return nil
	}
	r.Handoff = nil
	return split.Recoverable(ErrKVLoadFailed)
}

// kvLoadRerun counts a KV load failure and reports whether the request is
// re-run with a local prefill; under --on-kv-load-failure error it logs
// that the failure is passed on.
func (r *Request) kvLoadRerun() bool {
	r.P.M.KVLoadFailures.WithLabelValues(r.Label).Inc()
	if r.P.Cfg.OnKVLoadFailure == KVFailError {
		r.LogAt(zerolog.ErrorLevel).Msg("decode engine failed to load the remote KV; error passed on (--on-kv-load-failure error)")
		return false
	}
	return true
}

// namePrefiller takes the prefiller that x-prefiller-host-port value hv
// names, checked against the allowlist; an error is the reason to fall
// back (the request names one all the same).
func (r *Request) namePrefiller(hv []byte) error {
	p := r.P
	r.named = true
	hp, err := p.pickAllowed(hv)
	r.Prefiller, r.Label = hp, p.prefillerLabel(hp, err)
	r.logReady = false // the request's logger gets the prefiller field
	return err
}

// Account does an accounting action of a split's machine, or of the
// split.Refused rule, that is the request's: a retry, a degradation, a
// hedge's winner or its local leg's failure, counted and logged. The
// breaker's outcome is its split's (Sequential.Account, Paired.Account).
func (r *Request) Account(a split.Action) {
	switch a.Op {
	case split.Retrying:
		r.P.M.PrefillRetries.WithLabelValues(r.Label).Inc()
		r.LogAt(zerolog.WarnLevel).Err(a.Err).Int("attempt", a.Attempt).Msg("prefill failed; retrying")
	case split.Degraded:
		r.Degraded(a.Reason, a.Err)
	case split.HedgeWon:
		if a.Winner == split.WinnerLocal {
			r.P.hedge.Won(metrics.HedgeLocal, a.After)
			return
		}
		r.P.hedge.Won(metrics.HedgeRemote, a.After)
		r.LogAt(zerolog.InfoLevel).Msg("hedge: the prefill answered first; local prefill cancelled")
	case split.HedgeLocalFailed:
		if !r.Gone() {
			r.LogAt(zerolog.WarnLevel).Err(a.Err).Msg("hedge: local prefill failed; waiting for the prefill")
		}
	}
}

// SplitConfig is the sequential split's configuration.
func (p *Sidecar) SplitConfig() split.Config {
	return split.Config{
		PrefillTimeout: p.Cfg.PrefillTimeout,
		MaxRetries:     p.Cfg.PrefillMaxRetries,
		RetryBackoff:   p.Cfg.PrefillRetryBackoff,
		Fallback:       p.Cfg.PrefillFallback,
		DecodeTPSize:   p.Cfg.DecodeTPSize,
		Judge:          SplitJudge,
	}
}

// SplitJudge is what a failure means to a split: the proxy's one
// classifier (failure.Of), and whether it is a prefiller's rejection.
func SplitJudge(err error) split.Verdict {
	o := failure.Of(err)
	var rej *Rejected
	return split.Verdict{Reason: o.Reason, Retry: o.Retry, Rejected: errors.As(err, &rej), Plain: errors.Is(err, ErrPrefillWithHistory)}
}

// pickAllowed chooses the prefiller from the header value and, with SSRF
// protection on, checks it against the allowlist (guard.AdmitPrefiller); a
// denied one is counted and answered 403 by the caller (its outcome).
func (p *Sidecar) pickAllowed(hv []byte) (string, error) {
	hp, err := pickPrefiller(hv, p.Cfg.PrefillerSampling)
	if err != nil {
		return hp, err
	}
	if err := p.Guard.AdmitPrefiller(hp); err != nil {
		return hp, err
	}
	p.warm.Saw(hp, false) // a new prefiller is warmed up (prewarm.Warmer)
	return hp, nil
}

// prefillerLabel is the bounded metric label of an admitted prefiller; a
// refused one gets none, so it never takes a label slot.
func (p *Sidecar) prefillerLabel(hp string, err error) string {
	if err != nil {
		return ""
	}
	return p.M.Prefillers.Label(hp)
}

// RefusedAddr returns the first of addrs, named by the answer of the
// upstream peer (host:port), that SSRF protection refuses; ok is true when
// none is refused, or SSRF protection is off.
func (p *Sidecar) RefusedAddr(peer string, addrs []connectors.Addr) (refused connectors.Addr, ok bool) {
	al := p.Cfg.Guard.Allowlist
	if al == nil || len(addrs) == 0 {
		return connectors.Addr{}, true
	}
	own, _, err := net.SplitHostPort(peer)
	if err != nil {
		own = peer
	}
	for _, a := range addrs {
		if sameHost(a.Host, own) {
			continue
		}
		if a.Port > 0 && al.Allowed(net.JoinHostPort(a.Host, strconv.Itoa(a.Port))) {
			continue
		}
		return a, false
	}
	return connectors.Addr{}, true
}

// checkHandoff is the handoff of prefiller's answer as it may go on
// (wireChecked: undocumented members counted, or refused when strict; a
// side-channel host name replaced by the prefiller's host), or an error
// when RefusedAddr refuses one of its addresses for prefiller:
// ErrInvalidKVParams naming the member, never the address (an upstream's
// bytes).
func (p *Sidecar) checkHandoff(prefiller string, h connectors.Handoff) (connectors.Handoff, error) {
	h, err := p.wireChecked(prefiller, h)
	if err != nil {
		return h, err
	}
	return h, p.addrsAllowed(prefiller, h.Addrs)
}

// addrsAllowed is ErrInvalidKVParams naming the first of addrs, named by
// prefiller's answer, that RefusedAddr refuses (the member, never the
// address), or nil.
func (p *Sidecar) addrsAllowed(prefiller string, addrs []connectors.Addr) error {
	if a, ok := p.RefusedAddr(prefiller, addrs); !ok {
		return fmt.Errorf("%w: %s names an address that is neither the prefiller's host nor on the allowlist",
			connectors.ErrInvalidKVParams, a.Field)
	}
	return nil
}

// handoffAllowed is checkHandoff's verdict alone (prewarm.Driver).
func (p *Sidecar) handoffAllowed(prefiller string, h connectors.Handoff) error {
	_, err := p.checkHandoff(prefiller, h)
	return err
}
