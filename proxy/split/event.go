package split

import (
	"time"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// EventKind says what happened to a split.
type EventKind uint8

// The events a split's driver reports, one list for every machine: each
// machine takes those it knows and ignores the others.
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

	// A paired split's (split.Paired) own events.
	// FirstOutput: the decode leg produced its first output, the point of
	// no return: it is never cancelled from here on.
	FirstOutput
	// DecodeEnded: the decode leg's relay returned: Event.Err nil once the
	// answer is written or streaming; else its failure before any output
	// reached the client (one marked Recoverable, a KV load failure, a
	// local prefill may serve).
	DecodeEnded

	// A decode-first attempt's (split.DecodeFirst) own events.
	// FirstAnswerReady: the decode engine's answer to the decode-first leg
	// is ready to be relayed (a stream's first output, a JSON answer
	// whole), held: nothing of it has reached the client.
	FirstAnswerReady
	// FirstAnswerDeclined: the decode engine's answer declined the request
	// (not enough of its KV cached); nothing of it reached the client.
	FirstAnswerDeclined
	// FirstLegFailed: the decode-first leg failed before any output
	// (Event.Err); what it had is let go.
	FirstLegFailed
	// AfterDeclineBuilt: the body the usual split starts from after a
	// decline is built (and is the request's body from here on).
	AfterDeclineBuilt
	// AfterDeclineFailed: that body could not be built (Event.Err).
	AfterDeclineFailed
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
	// TimerKVWait bounds a paired split's wait for the prefill's outcome
	// (PairedConfig.KVWait).
	TimerKVWait
	timerEnd
)

// Timers is one past the last Timer: a driver keeps its timers in an
// array of this size, indexed by Timer.
const Timers = int(timerEnd)

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

// The actions of a split, one list for every machine. The first group is
// I/O, which each driver does its own way; the second is accounting
// (counters, spans, log lines), which both drivers do through the same
// code; then what only a paired split or a decode-first attempt does.
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

	// A paired split's (split.Paired) own actions.
	// CancelDecode cancels the decode leg, which has produced no output
	// (Action.Err: why); its relay then returns with that cause.
	CancelDecode
	// AbandonPrefill cancels the prefill leg on purpose: its end then says
	// nothing of the prefiller.
	AbandonPrefill
	// ReleaseOutput lets the decode leg's held first output through.
	ReleaseOutput
	// PrefillLegFailed counts and logs the prefill leg's failure
	// (Action.Err; Action.Reason: its label; Action.Attempt 1 when the
	// decode had already begun its output).
	PrefillLegFailed
	// OutputAtKVWait logs a held output relayed at the KV-wait bound.
	OutputAtKVWait
	// HandoffFailed: the decode engine could not load the KV the prefill
	// left it (Action.Err), and the request degrades: what was learnt of
	// the prefiller for the handoff (its bootstrap answer) is forgotten.
	HandoffFailed

	// A decode-first attempt's (split.DecodeFirst) own actions.
	// SendDecodeFirst sends the client's body to the decode engine and
	// reads its answer up to where it says whether it serves the request
	// (FirstAnswerReady, FirstAnswerDeclined, FirstLegFailed).
	SendDecodeFirst
	// DropDecodeFirst abandons the decode-first leg, in flight or its
	// answer held: its connection is closed, so the engine aborts it.
	DropDecodeFirst
	// RelayDecodeFirst makes the held answer the request's answer.
	RelayDecodeFirst
	// BuildAfterDecline builds the body every later leg, and a local
	// fallback, starts from once the decode engine declined
	// (AfterDeclineBuilt, AfterDeclineFailed).
	BuildAfterDecline
	// RunSplit hands the request to the usual split: it was not tried
	// first (Action.Reason ""), or the decode engine declined it
	// (Action.Reason DecodeFirstDeclined).
	RunSplit
	// DecodeFirstCounted counts the attempt's outcome (Action.Reason:
	// DecodeFirstServed or DecodeFirstDeclined).
	DecodeFirstCounted
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
