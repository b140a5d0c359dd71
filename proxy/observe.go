package proxy

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// RequestReport is how one inference request ended, as told to an Observer.
type RequestReport struct {
	// ID is the request id (X-Request-Id).
	ID string
	// Mode is metrics.ModeDisaggregated, ModeLocal or ModeFallback.
	Mode string
	// Reason is the fallback reason ("" when the request did not degrade).
	Reason string
	// Prefiller is the bounded metric label of the named prefiller ("" when
	// the request named none, or none that could be used).
	Prefiller string
	// Declined is why the sidecar served a request that named a prefiller
	// locally by choice, with no prefill leg (metrics.DeclineShortPrompt);
	// "" when it did not decline. Such a request is in Mode local, and no
	// fallback.
	Declined string
	// NamedPrefiller is true when the request carried
	// x-prefiller-host-port, whatever its value (one that names no usable
	// prefiller included).
	NamedPrefiller bool
	// Status is the HTTP status answered (499: the client left first).
	Status int
	// Start is when the request arrived; Duration how long it lived.
	Start    time.Time
	Duration time.Duration
	// PrefillDuration is the whole prefill phase (0: no prefill ran).
	PrefillDuration time.Duration
	// KVHandoffDuration is the decode leg's send to first output when it
	// carried remote KV (0: no handoff reached that point).
	KVHandoffDuration time.Duration
	// KVTransferred is true when the decode engine produced output from the
	// remote KV: KV really moved.
	KVTransferred bool
	// DecodeChunks is the number of chunk requests of a chunked decode (0:
	// the decode was not chunked).
	DecodeChunks int
	// Encoder is the encoder stage's outcome (metrics.StageEncoded, ...;
	// "" when the request went through no encoder stage).
	Encoder string
}

// Observer learns how every inference request ended. ObserveRequest is
// called exactly once per inference request, on the goroutine that ends it;
// it must be safe for concurrent use and must not block.
type Observer interface {
	ObserveRequest(RequestReport)
}

// Extras are the optional collaborators of a Proxy; the zero value has none.
type Extras struct {
	// Observer is told how each inference request ended (nil: nobody).
	Observer Observer
	// Debug serves GET /debug/pd (nil: the path goes to the local engine).
	Debug fasthttp.RequestHandler
	// Tracer starts the request, prefill, kv_handoff and decode spans (nil:
	// no spans, and an incoming traceparent is passed on untouched).
	Tracer trace.Tracer
	// Propagator reads the incoming trace context and writes it on both
	// legs (nil: W3C trace context).
	Propagator propagation.TextMapPropagator
}

// SetExtras installs optional collaborators. Call it before Run.
func (p *Proxy) SetExtras(e Extras) {
	if e.Tracer != nil && e.Propagator == nil {
		e.Propagator = propagation.TraceContext{}
	}
	p.ext = e
	p.legStrip, p.prefillStrip = nil, p.strip
	if e.Tracer != nil {
		for _, f := range e.Propagator.Fields() {
			p.legStrip = append(p.legStrip, strings.ToLower(f))
		}
		p.prefillStrip = append(slices.Clone(p.strip), p.legStrip...)
	}
}

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

// obsState is a request's bookkeeping for the Observer and its spans.
type obsState struct {
	reason     string
	declined   string // why the split was declined (shortprompt.go)
	encoder    string // the encoder stage's outcome (encode.go)
	status     int
	prefillDur time.Duration
	kvDur      time.Duration
	kvOK       bool
	chunks     int             // chunk requests of a chunked decode (chunked.go)
	root       trace.Span      // nil without a tracer
	tctx       context.Context // the request span's context
	leg        context.Context // trace context written on the next leg
	decode     trace.Span
	kv         trace.Span
}

// headerCarrier adapts fasthttp request headers to the propagator.
type headerCarrier struct{ h *fasthttp.RequestHeader }

// Get finds k in any letter case: the lane parses heads without
// normalizing their keys.
func (c headerCarrier) Get(k string) string {
	if v := c.h.Peek(k); v != nil {
		return string(v)
	}
	for hk, hv := range c.h.All() {
		if equalFold(hk, k) {
			return string(hv)
		}
	}
	return ""
}
func (c headerCarrier) Set(k, v string) { c.h.Set(k, v) }
func (c headerCarrier) Keys() []string {
	var ks []string
	for k := range c.h.All() {
		ks = append(ks, string(k))
	}
	return ks
}

// traceStart opens the request span, child of the client's trace context.
func (r *request) traceStart(h *fasthttp.RequestHeader) {
	t := r.p.ext.Tracer
	if t == nil {
		return
	}
	parent := r.p.ext.Propagator.Extract(context.Background(), headerCarrier{h})
	r.obs.tctx, r.obs.root = t.Start(parent, SpanRequest, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(r.start),
		trace.WithAttributes(AttrRequestID.String(r.id), attribute.String("http.route", r.api.String())))
	r.obs.leg = r.obs.tctx
}

// child opens a span under the request span (nil without a tracer).
func (r *request) child(name string, kind trace.SpanKind) (context.Context, trace.Span) {
	if r.obs.root == nil {
		return nil, nil
	}
	return r.p.ext.Tracer.Start(r.obs.tctx, name, trace.WithSpanKind(kind))
}

// injectTrace writes the current leg's trace context on an upstream request.
func (r *request) injectTrace(h *fasthttp.RequestHeader) {
	if r.obs.leg != nil {
		r.p.ext.Propagator.Inject(r.obs.leg, headerCarrier{h})
	}
}

// appendTrace appends the current leg's trace context as header lines of
// a leg's head the lane writes (nil without a tracer: nothing).
func (r *request) appendTrace(dst []byte) []byte {
	if r.obs.leg == nil {
		return dst
	}
	c := lineCarrier{dst: dst}
	r.p.ext.Propagator.Inject(r.obs.leg, &c)
	return c.dst
}

// lineCarrier writes what a propagator injects as header lines.
type lineCarrier struct{ dst []byte }

func (c *lineCarrier) Get(string) string { return "" }
func (c *lineCarrier) Set(k, v string)   { c.dst = appendHeaderLine(c.dst, []byte(k), []byte(v)) }
func (c *lineCarrier) Keys() []string    { return nil }

// prefillStarted opens the prefill span; the returned func records the
// prefill's duration and outcome.
func (r *request) prefillStarted(start time.Time) func(error) {
	ctx, span := r.child(SpanPrefill, trace.SpanKindClient)
	if span != nil {
		span.SetAttributes(AttrPrefiller.String(r.label))
		r.obs.leg = ctx
	}
	return func(err error) {
		d := time.Since(start)
		r.p.m.PrefillDuration.WithLabelValues(r.label).Observe(d.Seconds())
		if err == nil {
			r.p.hedge.observe(r.label, d) // hedge.go's auto hedge point
		}
		r.obs.prefillDur = d
		if span != nil {
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
				if rs := classify(err).reason; rs != "" {
					span.SetAttributes(AttrReason.String(rs))
				}
			}
			span.End()
		}
	}
}

// decodeStarted opens the decode span (and, for a leg carrying remote KV,
// the kv_handoff span) before the leg to the local engine is sent.
func (r *request) decodeStarted(remote bool) {
	if r.obs.root == nil {
		return
	}
	if r.obs.decode != nil { // a fallback after a failed remote decode
		r.obs.decode.End()
	}
	ctx, span := r.child(SpanDecode, trace.SpanKindClient)
	span.SetAttributes(AttrRemoteKV.Bool(remote))
	r.obs.decode, r.obs.leg = span, ctx
	if remote {
		_, r.obs.kv = r.child(SpanKVHandoff, trace.SpanKindInternal)
		r.obs.kv.SetAttributes(AttrPrefiller.String(r.label), attribute.String("pd.kv_handoff", "engine-pull"))
	}
}

// kvHandoffDone records the end of the engine-pull handoff: the decode leg
// sent at sent produced its first output (ok) or a KV load failure.
func (r *request) kvHandoffDone(sent time.Time, ok bool) {
	d := time.Since(sent)
	r.kvPending = nil // the engine read the KV, or tried (kvrelease.go)
	r.p.m.KVTransferDuration.WithLabelValues(r.label).Observe(d.Seconds())
	r.obs.kvDur, r.obs.kvOK = d, ok
	if ok && r.onOutput != nil {
		r.onOutput()
	}
	if r.obs.kv != nil {
		if !ok {
			r.obs.kv.SetStatus(codes.Error, ReasonKVLoadFailed)
			r.obs.kv.SetAttributes(AttrReason.String(ReasonKVLoadFailed))
		}
		r.obs.kv.End()
		r.obs.kv = nil
	}
}

// report ends the request's spans and tells the Observer how it ended.
func (r *request) report() {
	mode := r.mode
	if mode == metrics.ModeDisaggregated && r.prefiller == "" {
		mode = metrics.ModeLocal
	}
	if sp := r.obs.root; sp != nil {
		if r.obs.kv != nil {
			r.obs.kv.End()
		}
		if r.obs.decode != nil {
			r.obs.decode.End()
		}
		sp.SetAttributes(AttrDecision.String(mode), semStatus(r.obs.status))
		if r.obs.reason != "" {
			sp.SetAttributes(AttrReason.String(r.obs.reason))
		}
		if r.label != "" {
			sp.SetAttributes(AttrPrefiller.String(r.label))
		}
		if r.obs.status >= 500 {
			sp.SetStatus(codes.Error, "status "+statusLabel(r.obs.status))
		}
		sp.End()
	}
	if o := r.p.ext.Observer; o != nil {
		o.ObserveRequest(RequestReport{
			ID: r.id, Mode: mode, Reason: r.obs.reason, Declined: r.obs.declined, Prefiller: r.label, NamedPrefiller: r.named,
			Status: r.obs.status, Start: r.start, Duration: time.Since(r.start),
			PrefillDuration: r.obs.prefillDur, KVHandoffDuration: r.obs.kvDur,
			KVTransferred: r.obs.kvOK && mode == metrics.ModeDisaggregated,
			DecodeChunks:  r.obs.chunks,
			Encoder:       r.obs.encoder,
		})
	}
}

func semStatus(st int) attribute.KeyValue {
	return attribute.Int("http.response.status_code", st)
}

// CircuitState reports the circuit-breaker state of prefiller (host:port):
// "closed", "open" or "half_open"; with --circuit-probe-interval, an open
// circuit being probed reads "open (probing)", and one a probe found back,
// whose next request is the half-open trial, "open (probe up)". "" when no
// breaker is configured. It lets /debug/pd show per-prefiller circuits
// (status.CircuitStates).
func (p *Proxy) CircuitState(prefiller string) string {
	if p.guard == nil || p.cfg.Guard.Breaker.Failures == 0 {
		return ""
	}
	in := p.guard.CircuitInfo(prefiller)
	switch {
	case p.cfg.Guard.Breaker.ProbeInterval <= 0:
	case in.ProbeUp:
		return in.State.String() + " (probe up)"
	case in.Probing:
		return in.State.String() + " (probing)"
	}
	return in.State.String()
}

// CircuitLastProbe is when prefiller's open circuit was last probed (zero:
// not since it opened, or no breaker); status.CircuitStates.
func (p *Proxy) CircuitLastProbe(prefiller string) time.Time {
	if p.guard == nil || p.cfg.Guard.Breaker.Failures == 0 {
		return time.Time{}
	}
	return p.guard.CircuitInfo(prefiller).LastProbe
}
