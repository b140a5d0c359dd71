package sse

import "errors"

// The bound on one SSE event of an upstream stream, the same for every
// stream reader (Reader, and any incremental splitter that must agree with
// it): an event is its bytes as the upstream sent them, from its first byte
// to its blank line included (a final event without one: to the stream's
// end); blank lines between events do not count. An event longer than the
// bound is never held whole: the reader stops at the first byte past it and
// the stream is refused (ErrEventTooLong).

// DefaultMaxEventBytes is the bound when none is set: far more than any
// engine's event (a token's chunk, with logprobs, is a few KiB), small
// enough that a stream that never ends its event holds little.
const DefaultMaxEventBytes = 4 << 20

// ErrEventTooLong: an upstream SSE event ran past the bound
// (--max-sse-event-bytes). Its words are fixed: they reach the client, and
// nothing of the upstream's bytes may.
var ErrEventTooLong = errors.New("upstream SSE event longer than --max-sse-event-bytes")

// Bound is a reader's bound: n, or DefaultMaxEventBytes when n is unset
// (zero or less).
func Bound(n int) int {
	if n <= 0 {
		return DefaultMaxEventBytes
	}
	return n
}
