package inference

import (
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The bound on one SSE event of an upstream stream (--max-sse-event-bytes,
// sse.Bound), the same for every stream reader: fasthttp's goroutine reader
// (sse.Reader) and the event loops' (sserelay.Stream), whatever the
// connector or choreography that opened the stream. An event past it is
// refused (ErrEventTooLong), its upstream connection closed, and the client
// gets a 502 when nothing reached it yet, else an error event and [DONE].

// DefaultMaxSSEEventBytes is --max-sse-event-bytes' default
// (sse.DefaultMaxEventBytes): far more than any engine's event (a token's
// chunk, with logprobs, is a few KiB), small enough that a stream that
// never ends its event holds little.
const DefaultMaxSSEEventBytes = sse.DefaultMaxEventBytes

// MinMaxSSEEventBytes is the smallest --max-sse-event-bytes accepted: the
// events of a real stream (top logprobs, a usage chunk) must pass.
const MinMaxSSEEventBytes = 16 << 10

// ErrEventTooLong: an upstream SSE event ran past --max-sse-event-bytes
// (sse.ErrEventTooLong).
var ErrEventTooLong = sse.ErrEventTooLong

// EventRefused counts and logs a stream of the local engine refused for an
// event past the bound. It may run on any goroutine (a hedge's local leg
// is read beside the request's), so it logs with the request id, not
// through the request's own logger.
func (r *Request) EventRefused() {
	r.P.M.Upstream.Refused.WithLabelValues(metrics.UpstreamEngine, metrics.RefusedEventTooLong).Inc()
	r.P.Log.Error().Str("request_id", r.ID).Str("upstream", metrics.UpstreamEngine).Str("reason", metrics.RefusedEventTooLong).
		Int("max_sse_event_bytes", sse.Bound(r.P.Cfg.MaxSSEEventBytes)).
		Msg("upstream SSE event longer than --max-sse-event-bytes: stream refused, upstream connection closed")
}

// EventReader reads the local engine's stream on leg, bounded by
// --max-sse-event-bytes, a refusal counted.
func (r *Request) EventReader(leg *upstream.Leg) *sse.Reader {
	er := sse.NewReader(leg, &r.P.Bufs, r.P.Cfg.MaxSSEEventBytes)
	er.Refused = r.EventRefused
	return er
}

// An upstream leg shows what it received ahead, for sse.Reader.Pending.
var _ sse.Lookahead = (*upstream.Leg)(nil)
