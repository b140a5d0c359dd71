// Package split decides a P/D split: which leg goes out next, when a
// prefill is tried again, given up on or raced by a local prefill, what
// a failure degrades to, and whether a request the decode engine is asked
// first is served by it. It does no I/O. A choreography is a state machine
// fed events (a prefill answered or failed, a timer fired, a leg became
// ready, the client left) that returns the actions to take (send a leg,
// cancel one, arm a timer, relay, answer, count); the serving paths that
// own the sockets, fasthttp's goroutines and the event loops' lane, both
// execute those actions and decide nothing themselves, so the two cannot
// come to different decisions.
//
// A machine belongs to one request and is driven by one goroutine at a
// time (the request's, or the event loop's); it is not safe for concurrent
// use. An event that no longer applies (a timer that fired as it was
// disarmed, the answer of a prefill already given up on) is ignored.
package split
