package feature

import (
	"context"
	"iter"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// RequestTracer is a feature that traces requests (--tracing): its part
// in a request begins at the request's head, before its admission, so the
// request asks it there, once, for the request's Trace, and keeps it for
// every later point. The sidecar takes the first one registered.
type RequestTracer interface {
	Feature
	// TraceRequest opens the trace of the request whose client head is h,
	// arrived at start; id is the request id and route its API path.
	TraceRequest(h TraceHead, start time.Time, id, route string) Trace
}

// LegHeadDropper is a feature that leaves client headers out of the head
// of every leg (a trace context, which each leg carries anew): asked once,
// when the sidecar composes what its legs' heads leave out, for their
// names, lower case. It is the feature's, not a request's part's.
type LegHeadDropper interface {
	LegDrops() []string
}

// TraceHead is what a trace reads of the client's head: every field, in
// order.
type TraceHead interface {
	All() iter.Seq2[[]byte, []byte]
}

// HeaderSetter is a leg's head a trace writes its context on
// (fasthttp.RequestHeader is one).
type HeaderSetter interface {
	Set(key, value string)
}

// Trace is one request's trace: the spans the request opens and ends at
// the points both drivers pass (its prefill, its decode leg, the KV
// handoff, its end), and the trace context each leg carries. It is the
// request's, used on its goroutine, save where a method says otherwise.
type Trace interface {
	Tracer
	// StartPrefill opens the span of a prefill leg to the prefiller
	// labelled label, whose context the next leg carries; EndPrefill ends
	// it with the leg's outcome (nil: it answered a handoff), and may be
	// called on another goroutine (a paired split's prefill leg).
	StartPrefill(label string) trace.Span
	EndPrefill(span trace.Span, err error)
	// StartDecode opens the decode span before the leg to the local engine
	// is sent (and, for one carrying remote KV from the prefiller labelled
	// label, the KV handoff's); EndKVHandoff ends the handoff's with its
	// outcome: the decode's first output (ok), or a KV load failure.
	StartDecode(remote bool, label string)
	EndKVHandoff(ok bool)
	// End ends the request's spans: its mode (a metrics mode), the bounded
	// label of its prefiller ("": none), its fallback reason ("": none)
	// and the status answered.
	End(mode, label, reason string, status int)
	// Inject writes the current leg's trace context on a leg's head;
	// AppendTrace appends it as header lines of a raw head (the lane's).
	Inject(h HeaderSetter)
	AppendTrace(dst []byte) []byte
}

// Tracer is what an admission's blocking work (the encoder stage's legs)
// traces with: a span of kind, named name, as a child of the request's,
// and that span's context written on a leg's head.
type Tracer interface {
	Child(name string, kind trace.SpanKind) (context.Context, trace.Span)
	InjectSpan(ctx context.Context, h HeaderSetter)
}
