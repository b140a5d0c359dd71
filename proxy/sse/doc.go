// Package sse reads server-sent events from an untrusted upstream: it cuts
// a stream into events with a bound on one event's size (an event past it
// is never held whole: the stream ends with ErrEventTooLong), rewrites the
// data payloads of an event, frames the error event that ends a broken
// stream, and recycles the per-stream buffers that reading and relaying
// use (Bufs).
//
// It does no I/O of its own beyond reading the io.Reader it is given, and
// knows nothing of requests, metrics or logs: what a refusal costs is the
// caller's, told through Reader.Refused.
package sse
