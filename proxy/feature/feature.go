// Package feature declares what a request feature is and what it may do:
// a unit of its own (its package, its configuration, one registration line
// in proxy/inference's New) that takes part in every inference request at
// the points both serving drivers (fasthttp's goroutine driver and the lane)
// pass through. A feature is asked once per inference request, when the
// request's prefiller is named and allowed, none is named, or the one it
// names is refused (Request.Refused), with the request's head (Head); what
// it does for that request is its Use, whose abilities (SplitDecliner,
// Preparer, PrefillEditor, OptionalPrefill, DecodeParamsEditor, LegRanker,
// PairedLegBuilder, HandoffStepper, LocalEditor, KVSourceNamer,
// AnswerEditor, LocalAnswerEditor, HistoryReporter) a request's Uses find
// by type assertion and ask at each point. A feature that needs a new point in the
// request adds an ability here and a method to Uses; no driver knows a
// feature's name.
//
// A feature whose part begins earlier, at the request's head, traces
// requests (RequestTracer): the request asks it for its Trace then and
// keeps it for every later point. A feature may also declare, once, the
// client headers every leg (LegHeadDropper) or every prefill leg
// (PrefillHeadDropper) leaves out.
//
// Before that, every request passes its admission: the admitters
// (Admitter), each a package of its own registered by one line in New,
// run in order on the request's Admission (its body, stream flags, decode
// engine, session key) and may refuse it or make it wait on a Step.
package feature

import (
	"context"
	"net/netip"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Feature is a feature of inference requests.
type Feature interface {
	// Begin returns the feature's part in request r, whose head is h
	// (nil: nothing to do for it). It may count and log; it must not keep
	// h, which the lane reuses for the next request, nor r's body.
	Begin(r Request, h Head) Use
}

// Request is what a feature is told of the request it takes part in.
type Request struct {
	API  connectors.API
	Body []byte
	// Prefiller is the prefiller the request names, allowed ("": none, or
	// Refused).
	Prefiller string
	// Refused: the prefiller the request names is refused (not allowed,
	// malformed); the request falls back to the local engine with the
	// client's own body, whose answer is the only point left to take
	// part in (LocalAnswerEditor).
	Refused bool
	// Port is the sidecar port the request arrived on (its data-parallel
	// rank's).
	Port int
	// Session is the conversation's session key, when multi-turn KV reuse
	// is on and the request names one ("": none).
	Session string
	// Client is the address the request came from: the client
	// connection's TCP peer, on either driver (the zero Addr: unknown).
	Client netip.Addr
	// ID is the request's id (X-Request-ID), Local the engine that decodes
	// it, and Label its prefiller's bounded metric label ("": none).
	ID, Local, Label string
	// Routed: x-data-parallel-host-port picked the engine that decodes it.
	Routed bool
	// Log logs on the request's logger (request_id, path, prefiller).
	Log Logger
}

// Logger returns an event of level l on a request's logger, or nil (a
// no-op event) when l is not logged.
type Logger interface {
	LogAt(l zerolog.Level) *zerolog.Event
}

// Use is a feature's part in one request. Its abilities: SplitDecliner,
// PrefillEditor (and OptionalPrefill), LocalEditor, KVSourceNamer,
// AnswerEditor, LocalAnswerEditor, HistoryReporter.
type Use any

// SplitDecliner serves a request that names a prefiller locally instead of
// splitting it. DeclinedSplit is why (a bounded label of
// pd_sidecar_split_declined_total); the request counts it, reports it and
// is served in mode local. The feature logged what it saw.
type SplitDecliner interface{ DeclinedSplit() (reason string) }

// PrefillEditor edits the body of the prefill leg (after the connector
// built it); an error fails the request as a bad request.
type PrefillEditor interface {
	EditPrefill(body []byte) ([]byte, error)
}

// LocalEditor edits the body of a request the local engine prefills
// because none was split (no prefiller named, or the split declined); an
// error fails the request as a bad request. A fallback's local leg is the
// client's own body, unedited.
type LocalEditor interface {
	EditLocal(body []byte) ([]byte, error)
}

// KVSourceNamer names the engine whose P2P tier holds the prompt's prefix,
// for a choreography whose legs name it themselves (the offloading
// connector's concurrent legs).
type KVSourceNamer interface {
	KVSource() *connectors.P2PPeer
}

// OptionalPrefill is a PrefillEditor whose edit is an optimisation the
// prefill may fail on (a history the prefill engine is to pull first):
// when the prefill answers with a server error, DropPrefillEdit takes the
// edit back, reporting whether there was one, and the prefill is sent
// once more without it, before any retry or fallback of its own.
type OptionalPrefill interface {
	PrefillEditor
	DropPrefillEdit() bool
}

// AnswerEditor edits each piece of a split's decode answer (the whole JSON
// body, or one SSE event's data) after the connector's rewrite, in the
// order the pieces came: AnswerEdit is the edit, which returns data
// unchanged when nothing applies. The edit may keep what the pieces tell
// (it is called on the request's driver, one piece at a time) but not the
// slices themselves. A part that keeps nothing returns a function of its
// package's, so that a request's edit is had without an allocation.
type AnswerEditor interface {
	AnswerEdit() func(data []byte) []byte
}

// LocalAnswerEditor edits each piece of the answer of a request the local
// engine served without a split's KV (no prefiller named, the split
// declined, a fallback, a hedge's local leg, a decode-first answer), as
// AnswerEditor edits a split's decode answer, and the whole JSON answer of
// a chunked decode, split or not, which no AnswerEditor follows; the edit
// returns data unchanged when nothing applies.
type LocalAnswerEditor interface {
	LocalAnswerEdit() func(data []byte) []byte
}

// HistoryReporter says what a request's prefill did with a conversation's
// history, for the status view: "used", or why it carried none ("":
// nothing to say, as for a request whose prefill was not sent).
type HistoryReporter interface {
	HistoryOutcome() string
}

// PrefillHeadDropper is a feature that leaves client headers out of the
// head of every leg sent to a prefiller (--prefill-strip-headers): asked
// once, when the sidecar composes what its legs' heads leave out, for
// their names, lower case. It is the feature's, not a request's part's.
type PrefillHeadDropper interface {
	PrefillDrops() []string
}

// Preparer has a blocking step a split waits on before its first leg
// (MoRI-IO's host specs resolved), asked once the split is admitted; nil:
// none is needed.
type Preparer interface {
	PrepareStep() Step
}

// DecodeParamsEditor edits the kv_transfer_params a sequential split's
// decode leg carries (the prefill answer's), before the connector builds
// the leg's body; an error is a failure a local prefill may serve.
type DecodeParamsEditor interface {
	EditDecodeParams(params []byte) ([]byte, error)
}

// LegRanker names the x-data-parallel-rank every leg of the request
// carries ("": none; the client's own then goes as it came).
type LegRanker interface {
	LegRank() string
}

// PairedLegBuilder builds both legs' bodies of a paired split itself
// (MoRI-IO's parallel dispatch), from the request's body and the
// prefiller's host as the header named it.
type PairedLegBuilder interface {
	PairedLegs(body []byte, prefillHost string) (pre, dec []byte, err error)
}

// HandoffStepper takes a split's handoff on its way to the decode leg
// with a blocking step (the sidecar's own KV pull), whose continuation
// calls done with the handoff the decode leg carries, or the failure: a
// *KVLoadError when the decode engine's KV could not be loaded (judged as
// --on-kv-load-failure says); any other, the handoff's source failing,
// falls back to a local prefill.
type HandoffStepper interface {
	HandoffStep(h connectors.Handoff, done func(connectors.Handoff, error)) Step
}

// KVLoadError is a failure to load the prefill's KV for the decode leg,
// which the request re-runs with a local prefill or passes on, as
// --on-kv-load-failure says.
type KVLoadError struct{ Err error }

func (e *KVLoadError) Error() string { return e.Err.Error() }
func (e *KVLoadError) Unwrap() error { return e.Err }

// Step is a blocking call a request waits on (an encoder stage's
// fan-out, a DNS lookup, a bootstrap query, a KV pull), which both drivers
// run the same way: fasthttp's on the request's goroutine, the lane on a
// goroutine of its own, off its event loop. The call touches nothing of
// the request but what the step took when it was made; the func it
// returns goes on with its outcome, on the request's goroutine or its
// loop, and is not run when the request ended meanwhile (its context's end
// makes the call return).
type Step func(ctx context.Context) (then func())
