package feature

import (
	"net/netip"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Admitter is a part of every inference request's admission, before its
// prefiller is named and the features begin: a package of its own and one
// registration line in proxy/inference's New, which registers those that
// are on, in the order they run (the data-parallel rank, sanitize, the
// session key, the encoder stage). Admit does its part on admission a of
// the request whose head is h. It must keep neither h, which the lane
// reuses for the next request, nor a's body past the call: a step takes a
// copy of what it reads. An error refuses the request (its outcome is the
// answer). A returned step is a blocking call the admission waits on; its
// continuation finishes the admitter's part on a (a Refusal refuses the
// request) before the next admitter runs, a holding the request as it
// stands then.
type Admitter interface {
	Admit(a *Admission, h Head) (Step, error)
}

// Admission is what a request's admission is about: what its admitters
// read and may change. The request loads it from its own state before an
// admitter's part runs and takes back what changed after.
type Admission struct {
	// API is the inference API the request's path serves.
	API connectors.API
	// ID is the request's id.
	ID string
	// Body is the request's body: the client's until an admitter
	// replaces it with one of its own.
	Body []byte
	// Stream and Usage are the body's stream flags (stream,
	// stream_options.include_usage).
	Stream, Usage bool
	// Local is the engine of the request's decode legs: the one of the
	// data-parallel rank whose port it arrived on, or the one a header
	// names (Routed).
	Local  string
	Routed bool
	// Session is the conversation's session key, with multi-turn KV reuse
	// on ("": none named).
	Session string
	// Client is the address the request came from (the zero Addr:
	// unknown).
	Client netip.Addr
	// Log is the request's logger.
	Log RequestLogger
	// Trace starts the spans of the legs the admission sends (nil: the
	// request is not traced).
	Trace Tracer
	// Encoded is the encoder stage's outcome, for the request's report
	// ("": no stage ran).
	Encoded string
	// Refusal is the error a step's continuation refuses the request with
	// (nil: none).
	Refusal error
}

// RequestLogger is a request's logger: its events (Logger), and the
// logger itself, for work that logs off the request's goroutine; it is
// built on first use, so such work asks for it on the request's goroutine
// before it starts.
type RequestLogger interface {
	Logger
	Logger() *zerolog.Logger
}
