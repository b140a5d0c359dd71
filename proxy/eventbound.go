package proxy

import (
	"errors"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The bound on one SSE event of an upstream stream (--max-sse-event-bytes),
// the same for every stream reader: fasthttp's goroutine reader
// (eventReader) and the event loops' (loopStream.feed), whatever the
// connector or choreography that opened the stream. An event is its bytes
// as the upstream sent them, from its first byte to its blank line
// included (a final event without one: to the stream's end); blank lines
// between events do not count. An event longer than the bound is never
// held whole: the reader stops at the first byte past it, the stream is
// refused (ErrEventTooLong), its upstream connection closed, and the
// client gets a 502 when nothing reached it yet, else an error event and
// [DONE].

// DefaultMaxSSEEventBytes is --max-sse-event-bytes' default: far more than
// any engine's event (a token's chunk, with logprobs, is a few KiB), small
// enough that a stream that never ends its event holds little.
const DefaultMaxSSEEventBytes = 4 << 20

// MinMaxSSEEventBytes is the smallest --max-sse-event-bytes accepted: the
// events of a real stream (top logprobs, a usage chunk) must pass.
const MinMaxSSEEventBytes = 16 << 10

// ErrEventTooLong: an upstream SSE event ran past --max-sse-event-bytes.
// Its words are fixed: they reach the client, and nothing of the
// upstream's bytes may.
var ErrEventTooLong = errors.New("upstream SSE event longer than --max-sse-event-bytes")

// eventBound is a reader's bound: n, or the default when unset.
func eventBound(n int) int {
	if n <= 0 {
		return DefaultMaxSSEEventBytes
	}
	return n
}

// eventRefused counts and logs a stream of the local engine refused for an
// event past the bound. It may run on any goroutine (a hedge's local leg
// is read beside the request's), so it logs with the request id, not
// through the request's own logger.
func (r *request) eventRefused() {
	r.p.m.Upstream.Refused.WithLabelValues(metrics.UpstreamEngine, metrics.RefusedEventTooLong).Inc()
	r.p.log.Error().Str("request_id", r.id).Str("upstream", metrics.UpstreamEngine).Str("reason", metrics.RefusedEventTooLong).
		Int("max_sse_event_bytes", eventBound(r.p.cfg.MaxSSEEventBytes)).
		Msg("upstream SSE event longer than --max-sse-event-bytes: stream refused, upstream connection closed")
}

// eventReader reads the local engine's stream on leg, bounded by
// --max-sse-event-bytes, a refusal counted.
func (r *request) eventReader(leg *upstream.Leg) *eventReader {
	er := newEventReader(leg, &r.p.bufs, r.p.cfg.MaxSSEEventBytes)
	er.refused = r.eventRefused
	return er
}
