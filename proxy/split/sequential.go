package split

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
)

// Errors a split makes of its own decisions.
var (
	// ErrPrefillTimeout: the prefill leg did not answer within
	// --prefill-timeout (all attempts included).
	ErrPrefillTimeout error = failure.New("prefill timed out", failure.Outcome{Status: http.StatusGatewayTimeout, Reason: failure.ReasonTimeout})
	// ErrTPMismatch: the prefiller's tp_size exceeds --decode-tp-size.
	ErrTPMismatch error = failure.New("prefill tp_size larger than decode tp size", failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonTPMismatch})
	// ErrHedgeLost is the cause a hedge's losing leg is abandoned with.
	ErrHedgeLost = errors.New("hedge lost: the other leg was ready first")
)

// Verdict is what a failure means to a split, as the proxy's one
// classifier of errors says.
type Verdict struct {
	// Reason is the fallback reason: the failure is one a local prefill
	// may serve ("" none).
	Reason string
	// Retry marks a prefill failure worth another attempt.
	Retry bool
	// Rejected marks the prefiller's rejection of the request itself (a
	// 4xx), whose answer goes back to the client as it is.
	Rejected bool
	// Plain marks a prefill that failed on an optional part of its leg (a
	// conversation's history to pull first), which is taken out: the
	// prefill is sent again at once without it, once, before any retry
	// of its own.
	Plain bool
}

// Config is what a sequential split's decisions depend on.
type Config struct {
	// PrefillTimeout bounds the prefill, its retries included (> 0).
	PrefillTimeout time.Duration
	// MaxRetries is how many times a retryable prefill failure is tried
	// again (--prefill-max-retries).
	MaxRetries int
	// RetryBackoff is the pause before each retry.
	RetryBackoff time.Duration
	// Fallback lets a failure with a fallback reason degrade to a local
	// prefill (--prefill-fallback); otherwise it is answered.
	Fallback bool
	// DecodeTPSize, when > 0, refuses a handoff of a larger tp_size.
	DecodeTPSize int
	// Judge classifies a failure (required).
	Judge func(error) Verdict
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Start is what a sequential split begins with.
type Start struct {
	// NoPrefill is non-nil when no prefill is sent: the prefiller's circuit
	// breaker refused it, or its body could not be built. The split goes
	// straight to what NoPrefill degrades to. When nil, the breaker allowed the
	// prefill and the split reports its outcome (BreakerDone).
	NoPrefill error
	// HedgeAfter is the hedge point (0: no hedge).
	HedgeAfter time.Duration
	// TakeHedge spends one hedge from the budget at the hedge point,
	// reporting false when there is none left (nil: never).
	TakeHedge func() bool
}

// The stages of a sequential split.
type stage uint8

const (
	stageIdle       stage = iota
	stagePrefill          // an attempt in flight
	stageBackoff          // between attempts
	stageAwaitHedge       // the prefill failed; the hedge running is its fallback
	stageDecode           // the decode leg carries the KV
	stageLocal            // a local leg answers: a fallback or the hedge
	stageDone             // answered, or failed
)

// Sequential is one request's prefill → decode split: the prefill leg with
// its retries, backoff and timeout, the hedge raced against it, the
// circuit breaker's verdict, the TP guard, the answer from a prefill that
// ended generation, the decode leg, and what each failure degrades to.
type Sequential struct {
	cfg Config
	st  stage

	attempts  int   // failed attempts so far
	last      error // the last failed attempt's error
	armed     [Timers]bool
	began     time.Time // the prefill's start
	hedgeAt   time.Time // the hedge's start (zero: none ran)
	hedging   bool      // a hedge's local leg runs
	takeHedge func() bool
	plain     bool // the prefill was sent again without its optional part
	// fromPrefill: the answer is made from the prefill's (generation
	// ended on its first token)
	fromPrefill bool
	// buf holds the actions Start and On return, so that a split's events
	// cost no allocation of their own: what they return is valid until the
	// next call.
	buf [8]Action
}

// NewSequential returns an idle split.
func NewSequential(cfg Config) *Sequential {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Sequential{cfg: cfg}
}

// Done reports whether the split has handed the request its answer (or
// failure) and takes no more events that change it.
func (s *Sequential) Done() bool { return s.st == stageDone }

// Start begins the split. What it returns is valid until the next call of
// Start or On.
func (s *Sequential) Start(in Start) []Action {
	if s.st != stageIdle {
		return nil
	}
	acts := s.buf[:0]
	if in.NoPrefill != nil {
		return s.fallback(acts, in.NoPrefill)
	}
	s.st = stagePrefill
	s.began = s.cfg.Now()
	s.takeHedge = in.TakeHedge
	acts = append(acts, Action{Op: PrefillBegan}, s.arm(TimerPrefill, s.cfg.PrefillTimeout), Action{Op: SendPrefill})
	if in.HedgeAfter > 0 && in.TakeHedge != nil {
		acts = append(acts, s.arm(TimerHedge, in.HedgeAfter))
	}
	return acts
}

// On takes one event and returns what to do about it, valid until the
// next call of Start or On.
func (s *Sequential) On(ev Event) []Action {
	acts := s.buf[:0]
	switch ev.Kind {
	case PrefillAnswered:
		if s.st == stagePrefill {
			return s.answered(acts, ev.Handoff)
		}
	case PrefillFailed:
		if s.st == stagePrefill {
			return s.attemptFailed(acts, ev.Err)
		}
	case TimerFired:
		if int(ev.Timer) < len(s.armed) && s.armed[ev.Timer] {
			s.armed[ev.Timer] = false
			return s.fired(acts, ev.Timer)
		}
	case HedgeReady:
		if s.hedging {
			return s.hedgeReady(acts)
		}
	case HedgeFailed:
		if s.hedging {
			return s.hedgeFailed(acts, ev.Err)
		}
	case LegFailed:
		return s.legFailed(acts, ev.Err)
	case ClientGone:
		return s.clientGone(acts, ev.Err)
	}
	return nil
}

func (s *Sequential) arm(t Timer, d time.Duration) Action {
	s.armed[t] = true
	return Action{Op: Arm, Timer: t, After: d}
}

// disarm disarms t if it is armed.
func (s *Sequential) disarm(acts []Action, t Timer) []Action {
	if !s.armed[t] {
		return acts
	}
	s.armed[t] = false
	return append(acts, Action{Op: Disarm, Timer: t})
}

// fired handles a timer that fired while armed.
func (s *Sequential) fired(acts []Action, t Timer) []Action {
	switch t {
	case TimerBackoff:
		if s.st == stageBackoff {
			s.st = stagePrefill
			return append(acts, Action{Op: SendPrefill, Attempt: s.attempts})
		}
	case TimerPrefill:
		if s.st == stagePrefill || s.st == stageBackoff {
			err := fmt.Errorf("%w after %v", ErrPrefillTimeout, s.cfg.PrefillTimeout)
			if s.last != nil {
				err = fmt.Errorf("%w (after %w)", err, s.last)
			}
			acts = append(acts, Action{Op: CancelPrefill, Err: err})
			return s.prefillOver(acts, err)
		}
	case TimerHedge:
		if (s.st == stagePrefill || s.st == stageBackoff) && !s.hedging && s.takeHedge() {
			s.hedging, s.hedgeAt = true, s.cfg.Now()
			return append(acts, Action{Op: SendHedge})
		}
	}
	return nil
}

// attemptFailed handles a failed prefill attempt: tried again after the
// backoff while retries and the timeout allow, else the prefill's end.
func (s *Sequential) attemptFailed(acts []Action, err error) []Action {
	v := s.cfg.Judge(err)
	if v.Plain && !s.plain {
		s.plain = true
		s.last = err
		return append(acts, Action{Op: SendPrefill, Attempt: s.attempts, Plain: true})
	}
	if v.Retry && s.attempts < s.cfg.MaxRetries {
		s.attempts++
		s.last = err
		s.st = stageBackoff
		return append(acts, Action{Op: Retrying, Err: err, Attempt: s.attempts}, s.arm(TimerBackoff, s.cfg.RetryBackoff))
	}
	return s.prefillOver(acts, err)
}

// endPrefill closes the prefill's bookkeeping, once.
func (s *Sequential) endPrefill(acts []Action, err error) []Action {
	acts = s.disarm(acts, TimerPrefill)
	acts = s.disarm(acts, TimerBackoff)
	acts = s.disarm(acts, TimerHedge)
	return append(acts, Action{Op: PrefillEnded, Err: err}, Action{Op: BreakerDone, Err: err})
}

// prefillOver ends a prefill that failed with err for good.
func (s *Sequential) prefillOver(acts []Action, err error) []Action {
	acts = s.endPrefill(acts, err)
	v := s.cfg.Judge(err)
	if s.hedging {
		if !v.Rejected && s.degrades(v) {
			// The local leg already running is the fallback.
			s.st = stageAwaitHedge
			return append(acts, Action{Op: Degraded, Reason: v.Reason, Err: err})
		}
		acts = s.dropHedge(acts)
	}
	if v.Rejected {
		s.st = stageDone
		return append(acts, Action{Op: PassOn, Err: err})
	}
	return s.fallback(acts, err)
}

// answered takes the prefill's handoff.
func (s *Sequential) answered(acts []Action, h connectors.Handoff) []Action {
	acts = s.endPrefill(acts, nil)
	if s.hedging {
		acts = s.dropHedge(acts)
		acts = append(acts, Action{Op: HedgeWon, Winner: WinnerRemote, After: s.cfg.Now().Sub(s.hedgeAt)})
	}
	switch {
	case h.Done:
		s.st, s.fromPrefill = stageDecode, true // that answer may fail: recoverable
		return append(acts, Action{Op: AnswerPrefill, Handoff: h})
	case TPGuard(s.cfg.DecodeTPSize, h) != nil:
		return s.fallback(acts, TPGuard(s.cfg.DecodeTPSize, h))
	}
	s.st = stageDecode
	return append(acts, Action{Op: SendDecode, Handoff: h})
}

// degrades reports whether a failure of verdict v falls back to a local
// prefill.
func (s *Sequential) degrades(v Verdict) bool { return v.Reason != "" && s.cfg.Fallback }

// fallback degrades the request to a local prefill for cause, or answers
// cause when it is no reason to.
func (s *Sequential) fallback(acts []Action, cause error) []Action {
	v := s.cfg.Judge(cause)
	if !s.degrades(v) {
		s.st = stageDone
		return append(acts, Action{Op: Fail, Err: cause})
	}
	s.st = stageLocal
	return append(acts, Action{Op: Degraded, Reason: v.Reason, Err: cause}, Action{Op: SendLocal})
}

// TPGuard refuses (ErrTPMismatch) a handoff h from a prefiller of a larger
// tensor-parallel size than decodeTP, the local engine's (0: any): NIXL
// cannot pull it. Every reader of a handoff asks it.
func TPGuard(decodeTP int, h connectors.Handoff) error {
	if decodeTP > 0 && h.TPSize > decodeTP {
		return fmt.Errorf("%w: prefill tp_size %d > %d", ErrTPMismatch, h.TPSize, decodeTP)
	}
	return nil
}

// Refused is what a request does whose named prefiller it may not use
// (not allowed, or not host:port), before any split began: the rule
// every split's fallback follows — Degraded then SendLocal when cause is
// a reason to fall back that cfg allows, else Fail.
func Refused(cfg Config, cause error) []Action {
	s := Sequential{cfg: cfg}
	return s.fallback(nil, cause)
}

// dropHedge abandons the hedge's local leg.
func (s *Sequential) dropHedge(acts []Action) []Action {
	s.hedging = false
	return append(acts, Action{Op: DropHedge})
}

// hedgeReady makes the hedge's local leg the answer: the prefill, still
// running, is abandoned; or it had failed and the hedge is its fallback.
func (s *Sequential) hedgeReady(acts []Action) []Action {
	s.hedging = false
	if s.st == stagePrefill || s.st == stageBackoff {
		acts = append(acts, Action{Op: CancelPrefill, Err: ErrHedgeLost})
		acts = s.endPrefill(acts, ErrHedgeLost)
		acts = append(acts, Action{Op: Degraded, Reason: failure.ReasonSlowPrefill, Err: ErrHedgeLost})
	}
	s.st = stageLocal
	return append(acts, Action{Op: HedgeWon, Winner: WinnerLocal, After: s.cfg.Now().Sub(s.began)}, Action{Op: RelayHedge})
}

// hedgeFailed handles the hedge's local leg failing before it was ready:
// the prefill goes on alone, or, when the hedge was the fallback of a
// failed prefill, the failure is answered.
func (s *Sequential) hedgeFailed(acts []Action, err error) []Action {
	acts = s.dropHedge(acts)
	if s.st == stageAwaitHedge {
		s.st = stageDone
		return append(acts, Action{Op: Fail, Err: err})
	}
	return append(acts, Action{Op: HedgeLocalFailed, Err: err})
}

// legFailed handles the failure of the leg that was to answer: one marked
// Recoverable, or the answer from the prefill failing to be made, falls
// back; another is answered.
func (s *Sequential) legFailed(acts []Action, err error) []Action {
	switch s.st {
	case stageDecode:
		if s.fromPrefill || Recovers(err) {
			return s.fallback(acts, err)
		}
	case stageLocal:
	default:
		return nil
	}
	s.st = stageDone
	return append(acts, Action{Op: Fail, Err: err})
}

// clientGone abandons whatever runs; cause is why (the client's leaving).
func (s *Sequential) clientGone(acts []Action, cause error) []Action {
	switch s.st {
	case stagePrefill, stageBackoff:
		acts = append(acts, Action{Op: CancelPrefill, Err: cause})
		acts = s.endPrefill(acts, cause)
	case stageAwaitHedge:
	case stageIdle, stageDone:
		return nil
	default:
		// A leg answering the request sees the client leave itself.
		return nil
	}
	if s.hedging {
		acts = s.dropHedge(acts)
	}
	s.st = stageDone
	return append(acts, Action{Op: Fail, Err: cause})
}
