package split

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/pd-sidecar/pd-sidecar/failure"
)

// ErrKVWaitTimeout: the prefill leg had no outcome, and the decode leg no
// output, within the KV-wait bound of a paired split (MoRI-IO's
// --moriio-parallel-decode-wait-timeout).
var ErrKVWaitTimeout error = failure.New("prefill did not complete within the MoRI-IO parallel-dispatch KV-wait timeout", failure.Outcome{Status: http.StatusGatewayTimeout, Reason: failure.ReasonKVWaitTimeout})

// ErrAbandoned is the outcome reported to the breaker of a prefill leg
// cancelled because the request no longer needed it (its decode failed,
// its client left): it says nothing of the prefiller.
var ErrAbandoned = errors.New("prefill leg abandoned: the request no longer needs it")

// PairedConfig is what a paired split's decisions depend on.
type PairedConfig struct {
	// PrefillTimeout, when > 0, bounds the prefill leg
	// (--prefill-timeout): one not answered by then is cancelled, and
	// ends as failed with ErrPrefillTimeout.
	PrefillTimeout time.Duration
	// Fallback lets a failure with a fallback reason degrade to a local
	// prefill (--prefill-fallback).
	Fallback bool
	// KVWait, when > 0, bounds the wait for the prefill's outcome: with
	// no outcome and no decode output by then, both legs are cancelled
	// and the request falls back (ErrKVWaitTimeout).
	KVWait time.Duration
	// HoldOutput holds the decode leg's first output until the prefill
	// leg answered (or KVWait ran out): MoRI-IO's decode writes nothing
	// the prefill has not finished.
	HoldOutput bool
	// Judge classifies a failure (required).
	Judge func(error) Verdict
}

// PairedStart is what a paired split begins with.
type PairedStart struct {
	// NoLegs is non-nil when the legs are not sent: the circuit breaker
	// refused the prefill, the bootstrap query failed, or the legs could
	// not be built. The split goes to what NoLegs degrades to.
	NoLegs error
	// NoLegsReport, when non-nil, is reported to the breaker first: it had
	// allowed the prefill (a bootstrap failure; a body that could not be
	// built).
	NoLegsReport error
}

// Paired is one request's split whose prefill and decode legs run at once
// (SGLang, Mooncake, the offloading connector, MoRI-IO's parallel
// dispatch): a prefill leg that fails before the decode produced output
// cancels the decode and decides the request (its rejection passed on, or
// a local prefill); one that fails later is counted. A decode leg that
// fails abandons the prefill leg, and a KV load failure degrades to a
// local prefill. The prefill leg may outlive the answer: its outcome is
// still reported to the breaker.
type Paired struct {
	cfg PairedConfig

	started   bool
	done      bool  // the request has its answer (or failure)
	committed bool  // the decode produced output
	holding   bool  // its first output waits for the prefill (HoldOutput)
	prefilled bool  // the prefill leg has its outcome
	abandoned bool  // the prefill leg was cancelled on purpose
	gone      bool  // the client left
	cancelled error // why the decode leg was cancelled (nil: it was not)
	kvArmed   bool
	preArmed  bool // TimerPrefill
}

// NewPaired returns an idle paired split.
func NewPaired(cfg PairedConfig) *Paired { return &Paired{cfg: cfg} }

// Done reports whether the request has its answer or failure.
func (s *Paired) Done() bool { return s.done }

// Holding reports whether the decode leg's first output waits for the
// word to go on (ReleaseOutput).
func (s *Paired) Holding() bool { return s.holding }

// Start begins the split.
func (s *Paired) Start(in PairedStart) []Action {
	if s.started {
		return nil
	}
	s.started = true
	if in.NoLegs != nil {
		var acts []Action
		if in.NoLegsReport != nil {
			acts = append(acts, Action{Op: BreakerDone, Err: in.NoLegsReport})
		}
		s.prefilled = true
		return s.fallback(acts, in.NoLegs)
	}
	acts := []Action{{Op: SendPrefill}, {Op: SendDecode}}
	if s.cfg.PrefillTimeout > 0 {
		s.preArmed = true
		acts = append(acts, Action{Op: Arm, Timer: TimerPrefill, After: s.cfg.PrefillTimeout})
	}
	if s.cfg.KVWait > 0 {
		s.kvArmed = true
		acts = append(acts, Action{Op: Arm, Timer: TimerKVWait, After: s.cfg.KVWait})
	}
	return acts
}

// On takes one event and returns what to do about it.
func (s *Paired) On(ev Event) []Action {
	if !s.started {
		return nil
	}
	switch ev.Kind {
	case PrefillAnswered:
		return s.prefillEnded(nil)
	case PrefillFailed:
		return s.prefillEnded(ev.Err)
	case FirstOutput:
		return s.firstOutput()
	case TimerFired:
		if ev.Timer == TimerKVWait && s.kvArmed {
			s.kvArmed = false
			return s.kvWaitOver()
		}
		if ev.Timer == TimerPrefill && s.preArmed {
			s.preArmed = false
			return s.prefillTimedOut()
		}
	case DecodeEnded:
		return s.decodeEnded(ev.Err)
	case ClientGone:
		s.gone = true
		if s.prefilled || s.abandoned {
			return nil
		}
		s.abandoned = true
		return []Action{{Op: AbandonPrefill, Err: ev.Err}}
	}
	return nil
}

// prefillTimedOut cancels a prefill leg that has not answered within
// PrefillTimeout: its end, which the driver reports, is a failure that
// wraps ErrPrefillTimeout.
func (s *Paired) prefillTimedOut() []Action {
	if s.prefilled || s.abandoned {
		return nil
	}
	return []Action{{Op: CancelPrefill, Err: fmt.Errorf("%w after %v", ErrPrefillTimeout, s.cfg.PrefillTimeout)}}
}

// prefillEnded takes the prefill leg's outcome.
func (s *Paired) prefillEnded(err error) []Action {
	if s.prefilled {
		return nil
	}
	s.prefilled = true
	var acts []Action
	if s.preArmed {
		s.preArmed = false
		acts = append(acts, Action{Op: Disarm, Timer: TimerPrefill})
	}
	if s.kvArmed && !s.holding {
		s.kvArmed = false
		acts = append(acts, Action{Op: Disarm, Timer: TimerKVWait})
	}
	if s.holding {
		s.holding = false
		acts = append(acts, Action{Op: ReleaseOutput})
		if s.kvArmed {
			s.kvArmed = false
			acts = append(acts, Action{Op: Disarm, Timer: TimerKVWait})
		}
	}
	if err == nil {
		return append(acts, Action{Op: BreakerDone})
	}
	if s.abandoned {
		// Cancelled with the request: it says nothing of the prefiller.
		return append(acts, Action{Op: BreakerDone, Err: ErrAbandoned})
	}
	acts = append(acts, Action{Op: BreakerDone, Err: err})
	reason := s.cfg.Judge(err).Reason
	if reason == "" {
		reason = "rejected"
	}
	if s.committed || s.done {
		return append(acts, Action{Op: PrefillLegFailed, Err: err, Reason: reason, Attempt: 1})
	}
	s.cancelled = err
	return append(acts, Action{Op: PrefillLegFailed, Err: err, Reason: reason}, Action{Op: CancelDecode, Err: err})
}

// firstOutput marks the decode past its point of no return.
func (s *Paired) firstOutput() []Action {
	if s.committed || s.cancelled != nil {
		return nil
	}
	s.committed = true
	if s.cfg.HoldOutput && !s.prefilled {
		s.holding = true // until the prefill's outcome, or the KV-wait bound
		return nil
	}
	if s.kvArmed {
		s.kvArmed = false
		return []Action{{Op: Disarm, Timer: TimerKVWait}}
	}
	return nil
}

// kvWaitOver ends the KV wait: a decode with no output yet is cancelled
// with the prefill leg; a held output is let through.
func (s *Paired) kvWaitOver() []Action {
	if s.holding {
		s.holding = false
		return []Action{{Op: OutputAtKVWait}, {Op: ReleaseOutput}}
	}
	if s.committed || s.prefilled || s.cancelled != nil {
		return nil
	}
	err := fmt.Errorf("%w (%v)", ErrKVWaitTimeout, s.cfg.KVWait)
	s.cancelled = err
	acts := []Action{{Op: CancelDecode, Err: err}}
	if !s.abandoned { // the client's leaving may have abandoned it already
		s.abandoned = true
		acts = append(acts, Action{Op: AbandonPrefill, Err: err})
	}
	return acts
}

// decodeEnded takes the decode leg's end.
func (s *Paired) decodeEnded(err error) []Action {
	if s.done {
		return nil
	}
	var acts []Action
	if s.kvArmed {
		s.kvArmed = false
		acts = append(acts, Action{Op: Disarm, Timer: TimerKVWait})
	}
	s.holding = false // a held output ended with its leg: nothing to release
	if err == nil {
		s.done = true
		return acts
	}
	if s.gone {
		s.done = true
		if !s.prefilled && !s.abandoned {
			s.abandoned = true
			acts = append(acts, Action{Op: AbandonPrefill, Err: err})
		}
		return append(acts, Action{Op: Fail, Err: err})
	}
	if cause := s.cancelled; cause != nil && !s.committed {
		// The prefill leg failed first (or the KV wait ran out) and
		// cancelled the decode: its cause decides.
		if s.cfg.Judge(cause).Rejected {
			s.done = true
			return append(acts, Action{Op: PassOn, Err: cause})
		}
		return s.fallback(acts, cause)
	}
	if !s.prefilled && !s.abandoned {
		s.abandoned = true
		acts = append(acts, Action{Op: AbandonPrefill, Err: err})
	}
	if Recovers(err) {
		acts = append(acts, Action{Op: HandoffFailed, Err: err})
		return s.fallback(acts, err)
	}
	s.done = true
	return append(acts, Action{Op: Fail, Err: err})
}

// fallback degrades the request to a local prefill for cause, or answers
// cause when it is no reason to.
func (s *Paired) fallback(acts []Action, cause error) []Action {
	s.done = true
	v := s.cfg.Judge(cause)
	if v.Reason == "" || !s.cfg.Fallback {
		return append(acts, Action{Op: Fail, Err: cause})
	}
	return append(acts, Action{Op: Degraded, Reason: v.Reason, Err: cause}, Action{Op: SendLocal})
}
