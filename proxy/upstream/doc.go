// Package upstream is the sidecar's I/O with the engines it sends legs to:
// it sends a request to an upstream and reads its answer, within bounds,
// and says in fixed words what went wrong when that fails.
//
// A Transport keeps pooled connections per upstream (plain or TLS), and
// cancels a leg at any point by closing its connection when the leg's
// context ends; a pooled connection the upstream closed while idle is
// retried once on a fresh one. An answer is read whole (Transport.Do) or
// as a streamed Leg (Transport.Stream), whose connection an event loop
// may take over mid-body. Answers are read as ReadAnswer reads them: a
// head within the read buffer, interim answers skipped, a body within the
// per-answer bound and reserved from the buffer budget (Budget,
// AnswerHold) before it is kept; anything else is refused as
// ErrBadUpstreamAnswer. A failure is a LegError (the step that failed)
// and, for what the sidecar says of it, an UpstreamError (the upstream's
// role and a reason, ReasonOf), never the upstream's bytes. Long bodies
// are read into buffers recycled by size class (BodyPool).
//
// The package decides nothing about a request: which upstream a leg goes
// to, what it carries, and what a failure means for the client are the
// caller's.
package upstream
