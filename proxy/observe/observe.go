// Package observe observes an inference request: the tracing feature
// (Tracing, a feature.RequestTracer), whose part in a request (Spans) is
// the OpenTelemetry spans of the request and of its prefill, KV handoff
// and decode legs and the trace context each leg carries (on fasthttp
// heads, and as header lines of the raw heads the lane writes); the
// bookkeeping a request's report is made of (Report); and,
// at trace level, the log line of each leg sent. What a request is and
// when its legs start and end are the caller's; this package names the
// spans, sets their attributes and status, and carries their context.
package observe

import (
	"context"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// Span and attribute names of the sidecar's traces.
const (
	SpanRequest   = "pd-sidecar.request"
	SpanPrefill   = "prefill"
	SpanKVHandoff = "kv_handoff"
	SpanDecode    = "decode"
	// AttrDecision is the request's mode (disaggregated, local, fallback).
	AttrDecision = attribute.Key("pd.decision")
	// AttrReason is the fallback reason.
	AttrReason = attribute.Key("pd.reason")
	// AttrPrefiller is the bounded prefiller label.
	AttrPrefiller = attribute.Key("pd.prefiller")
	// AttrRemoteKV marks a decode leg carrying remote KV.
	AttrRemoteKV = attribute.Key("pd.remote_kv")
	// AttrRequestID is the request id.
	AttrRequestID = attribute.Key("pd.request_id")
)

// Config is what a Tracing is made of.
type Config struct {
	// Tracer starts the spans (nil: no Tracing).
	Tracer trace.Tracer
	// Propagator reads the client's trace context and writes each leg's
	// (nil: W3C trace context).
	Propagator propagation.TextMapPropagator
	// Reason is the fallback reason of a failed prefill leg's error, which
	// its span carries as AttrReason ("": none; nil: never any).
	Reason func(error) string
	// KVLoadFailed is the status description and AttrReason of a
	// kv_handoff span whose KV failed to load.
	KVLoadFailed string
}

// Tracing starts the spans of requests and writes their trace context on
// legs: a request feature (feature.RequestTracer), registered when the
// sidecar has a tracer. Safe for concurrent use.
type Tracing struct {
	tracer       trace.Tracer
	prop         propagation.TextMapPropagator
	reason       func(error) string
	kvLoadFailed string
	fields       []string // the propagator's fields, lower case
	// server and client are the span kinds' start options, made once.
	server, client trace.SpanStartOption
}

// NewTracing returns the Tracing of c, or nil when c has no Tracer.
func NewTracing(c Config) *Tracing {
	if c.Tracer == nil {
		return nil
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	t := &Tracing{tracer: c.Tracer, prop: c.Propagator, reason: c.Reason, kvLoadFailed: c.KVLoadFailed,
		server: trace.WithSpanKind(trace.SpanKindServer), client: trace.WithSpanKind(trace.SpanKindClient)}
	for _, f := range c.Propagator.Fields() {
		t.fields = append(t.fields, strings.ToLower(f))
	}
	return t
}

// Begin is the feature's part in a request at the split's points: none.
// A request's trace begins at its head, before its admission
// (TraceRequest), and the request asks it at every point after.
func (t *Tracing) Begin(feature.Request, feature.Head) feature.Use { return nil }

// LegDrops are the client's headers every leg leaves out, lower case: the
// trace context's, which each leg carries anew.
func (t *Tracing) LegDrops() []string { return t.fields }

// TraceRequest opens the request span, begun at start, child of the trace
// context of the client's head h; id is the request id and route the API
// path.
func (t *Tracing) TraceRequest(h feature.TraceHead, start time.Time, id, route string) feature.Trace {
	parent := t.prop.Extract(context.Background(), readFields(h, t.fields))
	o := &Spans{t: t}
	o.tctx, o.root = t.tracer.Start(parent, SpanRequest, t.server,
		trace.WithTimestamp(start),
		trace.WithAttributes(AttrRequestID.String(id), attribute.String("http.route", route)))
	o.leg = o.tctx
	return o
}

// EndPrefill ends span, a prefill span (from StartPrefill; nil: nothing),
// with the outcome of its leg: err, nil when it answered. It may be called
// on another goroutine than the request's.
func (o *Spans) EndPrefill(span trace.Span, err error) {
	t := o.t
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		if t.reason != nil {
			if rs := t.reason(err); rs != "" {
				span.SetAttributes(AttrReason.String(rs))
			}
		}
	}
	span.End()
}

// Report is one inference request's bookkeeping for its report. It is
// owned by the request's goroutine.
type Report struct {
	// Reason is the fallback reason ("" when the request did not degrade).
	Reason string
	// Declined is why the split was declined (a feature's
	// metrics.Decline* reason; "": it was not).
	Declined string
	// Encoder is the encoder stage's outcome ("": no encoder stage).
	Encoder string
	// Status is the HTTP status answered.
	Status int
	// PrefillDur is the whole prefill phase (0: no prefill ran).
	PrefillDur time.Duration
	// KVDur is the decode leg's send to first output or KV load failure
	// when it carried remote KV, and KVOK whether it was first output.
	KVDur time.Duration
	KVOK  bool
	// Chunks is the number of chunk requests of a chunked decode.
	Chunks int
}

// Spans are one inference request's trace (feature.Trace): its spans and
// the context its next leg carries. They are owned by the request's
// goroutine, save where a method says otherwise.
type Spans struct {
	t      *Tracing
	root   trace.Span
	tctx   context.Context // the request span's context
	leg    context.Context // trace context written on the next leg
	decode trace.Span
	kv     trace.Span
}

var _ feature.RequestTracer = (*Tracing)(nil)
var _ feature.Trace = (*Spans)(nil)

// Child opens a span under the request span. It may be called on several
// goroutines at once.
func (o *Spans) Child(name string, kind trace.SpanKind) (context.Context, trace.Span) {
	return o.t.tracer.Start(o.tctx, name, trace.WithSpanKind(kind))
}

// startLeg opens a client span, named name, under the request span.
func (o *Spans) startLeg(name string) (context.Context, trace.Span) {
	return o.t.tracer.Start(o.tctx, name, o.t.client)
}

// InjectSpan writes the trace context of ctx (a Child span's) on a leg's
// head h. It may be called on several goroutines at once.
func (o *Spans) InjectSpan(ctx context.Context, h feature.HeaderSetter) {
	o.t.prop.Inject(ctx, setCarrier{h})
}

// Inject writes the current leg's trace context on a leg's head h.
func (o *Spans) Inject(h feature.HeaderSetter) {
	o.t.prop.Inject(o.leg, setCarrier{h})
}

// AppendTrace appends the current leg's trace context as header lines of
// a leg's head the lane writes.
func (o *Spans) AppendTrace(dst []byte) []byte {
	c := lineCarrier{dst: dst}
	o.t.prop.Inject(o.leg, &c)
	return c.dst
}

// StartPrefill opens the prefill span of a leg to the prefiller labelled
// label and makes it the context the next leg carries; it returns the
// span, for EndPrefill.
func (o *Spans) StartPrefill(label string) trace.Span {
	ctx, span := o.startLeg(SpanPrefill)
	span.SetAttributes(AttrPrefiller.String(label))
	o.leg = ctx
	return span
}

// StartDecode opens the decode span (and, for a leg carrying remote KV
// from the prefiller labelled label, the kv_handoff span) before the leg
// to the local engine is sent; a decode span still open (a fallback after
// a failed remote decode) is ended first.
func (o *Spans) StartDecode(remote bool, label string) {
	if o.decode != nil { // a fallback after a failed remote decode
		o.decode.End()
	}
	ctx, span := o.startLeg(SpanDecode)
	span.SetAttributes(AttrRemoteKV.Bool(remote))
	o.decode, o.leg = span, ctx
	if remote {
		_, o.kv = o.Child(SpanKVHandoff, trace.SpanKindInternal)
		o.kv.SetAttributes(AttrPrefiller.String(label), attribute.String("pd.kv_handoff", "engine-pull"))
	}
}

// EndKVHandoff ends the kv_handoff span, if open: the decode leg produced
// its first output (ok) or a KV load failure.
func (o *Spans) EndKVHandoff(ok bool) {
	if o.kv == nil {
		return
	}
	if !ok {
		o.kv.SetStatus(codes.Error, o.t.kvLoadFailed)
		o.kv.SetAttributes(AttrReason.String(o.t.kvLoadFailed))
	}
	o.kv.End()
	o.kv = nil
}

// End ends the request's spans, the request span with its mode (the
// request's metrics mode), label, the bounded label of its prefiller ("":
// none), its fallback reason ("": none) and the status answered.
func (o *Spans) End(mode, label, reason string, status int) {
	sp := o.root
	if o.kv != nil {
		o.kv.End()
	}
	if o.decode != nil {
		o.decode.End()
	}
	attrs := [4]attribute.KeyValue{AttrDecision.String(mode), semStatus(status)}
	n := 2
	if reason != "" {
		attrs[n] = AttrReason.String(reason)
		n++
	}
	if label != "" {
		attrs[n] = AttrPrefiller.String(label)
		n++
	}
	sp.SetAttributes(attrs[:n]...)
	if status >= 500 {
		sp.SetStatus(codes.Error, "status "+strconv.Itoa(status))
	}
	sp.End()
}

func semStatus(st int) attribute.KeyValue {
	return attribute.Int("http.response.status_code", st)
}
