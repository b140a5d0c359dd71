package core

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The bound on one SSE event of an upstream stream (--max-sse-event-bytes,
// sse.Bound), the same for every stream reader: fasthttp's goroutine reader
// (sse.Reader) and the event loops' (sserelay.Stream), whatever the
// connector or choreography that opened the stream. An event past it is
// refused (sse.ErrEventTooLong), its upstream connection closed, and the client
// gets a 502 when nothing reached it yet, else an error event and [DONE].

// MinMaxSSEEventBytes is the smallest --max-sse-event-bytes accepted: the
// events of a real stream (top logprobs, a usage chunk) must pass.
const MinMaxSSEEventBytes = 16 << 10

// An upstream leg shows what it received ahead, for sse.Reader.Pending.
var _ sse.Lookahead = (*upstream.Leg)(nil)
