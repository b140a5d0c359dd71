package split

import (
	"time"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// EventKind says what happened to a split.
type EventKind uint8

// The events a split's driver reports.
const (
	// PrefillAnswered: the prefill leg's answer was a checked handoff
	// (Event.Handoff).
	PrefillAnswered EventKind = iota + 1
	// PrefillFailed: one attempt of the prefill leg failed (Event.Err):
	// it could not be built or sent, the prefiller did not answer, or its
	// answer was no handoff (a rejection among them).
	PrefillFailed
	// TimerFired: the timer Event.Timer, armed by an Arm action, fired.
	TimerFired
	// HedgeReady: the hedge's local leg is ready to be relayed (a stream's
	// first output, a JSON answer whole), nothing of it relayed yet.
	HedgeReady
	// HedgeFailed: the hedge's local leg failed before it was ready
	// (Event.Err).
	HedgeFailed
	// LegFailed: the leg that was to answer the request (the decode leg,
	// the local leg of a fallback, or the answer from the prefill) failed
	// before anything reached the client (Event.Err). An error marked
	// Recoverable, or any failure of the answer from the prefill, is one a
	// local prefill may serve instead.
	LegFailed
	// ClientGone: the client left.
	ClientGone
)

// Timer names one of a split's timers.
type Timer uint8

// A split's timers.
const (
	// TimerPrefill bounds the prefill, its retries included
	// (--prefill-timeout).
	TimerPrefill Timer = iota + 1
	// TimerBackoff is the pause before a prefill is tried again
	// (--prefill-retry-backoff).
	TimerBackoff
	// TimerHedge is the hedge point: a prefill not answered by then is
	// raced by a local prefill (--prefill-hedge-after).
	TimerHedge
)

// Event is one input of a split.
type Event struct {
	Kind EventKind
	// Err is what failed (PrefillFailed, HedgeFailed, LegFailed).
	Err error
	// Timer is the timer that fired (TimerFired).
	Timer Timer
	// Handoff is the prefill's checked answer (PrefillAnswered).
	Handoff connectors.Handoff
}

// Op is what a driver does for an action.
type Op uint8

// The actions of a split. The first group is I/O, which each driver does
// its own way; the second is accounting (counters, spans, log lines),
// which both drivers do through the same code.
const (
	// SendPrefill sends the prefill leg (Action.Attempt: 0 the first
	// time, then each retry).
	SendPrefill Op = iota + 1
	// CancelPrefill abandons the prefill leg in flight, if any: its
	// connection is closed, so the prefiller drops the request
	// (Action.Err: why).
	CancelPrefill
	// Arm arms Action.Timer to fire after Action.After; an armed timer
	// armed again is re-armed.
	Arm
	// Disarm disarms Action.Timer (a fire already on its way is ignored).
	Disarm
	// SendHedge sends the client's own body to the local engine, its
	// answer held until it is ready (HedgeReady) and relayed only on
	// RelayHedge.
	SendHedge
	// DropHedge abandons the hedge's local leg before anything of it was
	// relayed: its connection is closed, so the engine aborts it.
	DropHedge
	// RelayHedge makes the hedge's held answer the request's answer.
	RelayHedge
	// SendDecode sends the decode leg carrying Action.Handoff and relays
	// its answer.
	SendDecode
	// SendLocal sends the client's own body to the local engine and
	// relays its answer: a local prefill, the fallback.
	SendLocal
	// AnswerPrefill answers with the prefill's own answer: generation
	// ended on its first token (Action.Handoff.Done).
	AnswerPrefill
	// PassOn answers with the prefiller's rejection of the request (a
	// 4xx, Action.Err).
	PassOn
	// Fail answers Action.Err, which nothing can recover.
	Fail

	// PrefillBegan: the prefill's span, duration and in-flight gauge
	// begin (once, before the first attempt).
	PrefillBegan
	// PrefillEnded: the prefill ended, retries included (Action.Err: how;
	// nil: it answered a handoff).
	PrefillEnded
	// BreakerDone reports the prefill's outcome to the prefiller's
	// circuit breaker, whose Allow the split's start took (Action.Err).
	BreakerDone
	// Retrying: the prefill failed (Action.Err) and is tried again after
	// the backoff (Action.Attempt: the attempt that failed, from 1).
	Retrying
	// Degraded: the request falls back to local prefill (Action.Reason,
	// the fallback reason; Action.Err: why).
	Degraded
	// HedgeWon: the hedge ended with Action.Winner ready first, its loser
	// having run for Action.After.
	HedgeWon
	// HedgeLocalFailed: the hedge's local leg failed (Action.Err) and the
	// prefill goes on alone.
	HedgeLocalFailed
)

// Winners of a hedge (HedgeWon's Action.Winner).
const (
	WinnerRemote = "remote"
	WinnerLocal  = "local"
)

// Action is one output of a split.
type Action struct {
	Op Op
	// Err is the cause (CancelPrefill, PassOn, Fail, PrefillEnded,
	// BreakerDone, Retrying, Degraded, HedgeLocalFailed).
	Err error
	// Timer and After are Arm's and Disarm's timer and Arm's delay;
	// After is also HedgeWon's time the loser ran.
	Timer Timer
	After time.Duration
	// Attempt is SendPrefill's and Retrying's attempt.
	Attempt int
	// Handoff is what SendDecode carries and AnswerPrefill answers from.
	Handoff connectors.Handoff
	// Reason is Degraded's fallback reason.
	Reason string
	// Winner is HedgeWon's winner.
	Winner string
	// Plain is SendPrefill's: the leg's body is built again, without the
	// optional part the last attempt failed on (Verdict.Plain).
	Plain bool
}
