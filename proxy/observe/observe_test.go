package observe_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/observe"
)

const (
	clientParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	clientTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan   = "00f067aa0ba902b7"
	kvLoadFailed = "kv_load_failed"
)

var errRefused = errors.New("refused")

// newTracing is a Tracing recording its spans in the returned recorder;
// the reason of errRefused is "unreachable", of other errors none.
func newTracing(t *testing.T) (*observe.Tracing, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := observe.NewTracing(observe.Config{
		Tracer: tp.Tracer("test"),
		Reason: func(err error) string {
			if errors.Is(err, errRefused) {
				return "unreachable"
			}
			return ""
		},
		KVLoadFailed: kvLoadFailed,
	})
	require.NotNil(t, tr)
	return tr, rec
}

// clientHead is a client's head carrying the client's traceparent under
// key, its letters kept as they are (as the lane parses heads).
func clientHead(key string) *fasthttp.RequestHeader {
	h := &fasthttp.RequestHeader{}
	h.DisableNormalizing()
	h.SetMethod(fasthttp.MethodPost)
	h.SetRequestURI("/v1/completions")
	h.Set(key, clientParent)
	return h
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) (string, bool) {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value.String(), true
		}
	}
	return "", false
}

func byName(t *testing.T, spans []sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	m := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		require.NotContains(t, m, s.Name(), "one span of each name")
		m[s.Name()] = s
	}
	return m
}

// legParent is the span id the traceparent of a leg's head names, which
// continues the client's trace.
func legParent(t *testing.T, tp string) string {
	t.Helper()
	parts := strings.Split(tp, "-")
	require.Len(t, parts, 4, "traceparent %q", tp)
	assert.Equal(t, clientTrace, parts[1], "the leg continues the client's trace")
	return parts[2]
}

func TestStartContinuesTheClientsTrace(t *testing.T) {
	for _, key := range []string{"traceparent", "Traceparent", "TRACEPARENT"} {
		t.Run(key, func(t *testing.T) {
			tr, rec := newTracing(t)
			start := time.Now().Add(-time.Second)
			o := tr.TraceRequest(clientHead(key), start, "req-1", "/v1/completions")
			o.End("local", "", "", fasthttp.StatusOK)

			spans := rec.Ended()
			require.Len(t, spans, 1)
			root := spans[0]
			assert.Equal(t, observe.SpanRequest, root.Name())
			assert.Equal(t, trace.SpanKindServer, root.SpanKind())
			assert.Equal(t, clientTrace, root.SpanContext().TraceID().String())
			assert.Equal(t, clientSpan, root.Parent().SpanID().String())
			assert.True(t, root.StartTime().Equal(start), "the span begins when the request arrived")
			for k, want := range map[attribute.Key]string{
				observe.AttrRequestID: "req-1", "http.route": "/v1/completions",
				observe.AttrDecision: "local", "http.response.status_code": "200",
			} {
				got, _ := attr(root, k)
				assert.Equal(t, want, got, string(k))
			}
			for _, k := range []attribute.Key{observe.AttrReason, observe.AttrPrefiller} {
				_, ok := attr(root, k)
				assert.False(t, ok, "%s: none to set", k)
			}
			assert.Equal(t, codes.Unset, root.Status().Code)
		})
	}
}

func TestRequestSpans(t *testing.T) {
	tests := []struct {
		name       string
		prefillErr error
		remote     bool
		fallback   bool // a local decode after the remote one
		kvOK       bool
		status     int
		reason     string
		spans      []string
		prefill    string // the prefill span's AttrReason
		kvStatus   codes.Code
		rootStatus codes.Code
	}{
		{name: "split", remote: true, kvOK: true, status: 200,
			spans: []string{observe.SpanRequest, observe.SpanPrefill, observe.SpanKVHandoff, observe.SpanDecode}},
		{name: "prefill refused", prefillErr: errRefused, status: 200, reason: "unreachable",
			spans: []string{observe.SpanRequest, observe.SpanPrefill, observe.SpanDecode}, prefill: "unreachable"},
		{name: "prefill failed without a reason", prefillErr: errors.New("odd"), status: 200,
			spans: []string{observe.SpanRequest, observe.SpanPrefill, observe.SpanDecode}},
		{name: "kv load failed, then a local decode", remote: true, fallback: true, status: 200, reason: kvLoadFailed,
			spans:    []string{observe.SpanRequest, observe.SpanPrefill, observe.SpanKVHandoff, observe.SpanDecode, observe.SpanDecode},
			kvStatus: codes.Error},
		{name: "decode answered 502", remote: true, kvOK: true, status: 502,
			spans:      []string{observe.SpanRequest, observe.SpanPrefill, observe.SpanKVHandoff, observe.SpanDecode},
			rootStatus: codes.Error},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, rec := newTracing(t)
			o := tr.TraceRequest(clientHead("traceparent"), time.Now(), "req-1", "/v1/completions")

			span := o.StartPrefill("p:1")
			require.NotNil(t, span)
			var pre fasthttp.RequestHeader
			o.Inject(&pre)
			o.EndPrefill(span, tc.prefillErr)

			o.StartDecode(tc.remote, "p:1")
			var dec fasthttp.RequestHeader
			o.Inject(&dec)
			head := o.AppendTrace([]byte("POST /v1/completions HTTP/1.1\r\n"))
			if tc.remote {
				o.EndKVHandoff(tc.kvOK)
			}
			if tc.fallback {
				o.StartDecode(false, "p:1")
			}
			o.End("disaggregated", "p:1", tc.reason, tc.status)

			ended := rec.Ended()
			var names []string
			for _, s := range ended {
				names = append(names, s.Name())
				assert.Equal(t, clientTrace, s.SpanContext().TraceID().String(), s.Name())
			}
			assert.ElementsMatch(t, tc.spans, names)
			var root, prefill, kv, decode sdktrace.ReadOnlySpan
			for _, s := range ended {
				switch s.Name() {
				case observe.SpanRequest:
					root = s
				case observe.SpanPrefill:
					prefill = s
				case observe.SpanKVHandoff:
					kv = s
				case observe.SpanDecode:
					if decode == nil { // the first decode span ends first
						decode = s
					}
				}
			}
			for _, s := range ended {
				if s != root {
					assert.Equal(t, root.SpanContext().SpanID(), s.Parent().SpanID(), "%s is the request's child", s.Name())
				}
			}

			// Each leg carries its own span's context.
			assert.Equal(t, prefill.SpanContext().SpanID().String(), legParent(t, string(pre.Peek("traceparent"))))
			assert.Equal(t, decode.SpanContext().SpanID().String(), legParent(t, string(dec.Peek("traceparent"))))
			line := "traceparent: 00-" + clientTrace + "-" + decode.SpanContext().SpanID().String() + "-01\r\n"
			assert.Equal(t, "POST /v1/completions HTTP/1.1\r\n"+line, string(head), "the lane's head gets the decode leg's")

			assert.Equal(t, trace.SpanKindClient, prefill.SpanKind())
			got, _ := attr(prefill, observe.AttrPrefiller)
			assert.Equal(t, "p:1", got)
			got, _ = attr(prefill, observe.AttrReason)
			assert.Equal(t, tc.prefill, got)
			if tc.prefillErr != nil {
				assert.Equal(t, codes.Error, prefill.Status().Code)
				assert.Equal(t, tc.prefillErr.Error(), prefill.Status().Description)
				require.Len(t, prefill.Events(), 1, "the error is recorded")
				assert.Equal(t, "exception", prefill.Events()[0].Name)
			}

			assert.Equal(t, trace.SpanKindClient, decode.SpanKind())
			got, _ = attr(decode, observe.AttrRemoteKV)
			assert.Equal(t, map[bool]string{true: "true", false: "false"}[tc.remote], got)
			if kv != nil {
				assert.Equal(t, trace.SpanKindInternal, kv.SpanKind())
				got, _ = attr(kv, observe.AttrPrefiller)
				assert.Equal(t, "p:1", got)
				got, _ = attr(kv, "pd.kv_handoff")
				assert.Equal(t, "engine-pull", got)
				assert.Equal(t, tc.kvStatus, kv.Status().Code)
				if tc.kvStatus == codes.Error {
					assert.Equal(t, kvLoadFailed, kv.Status().Description)
					got, _ = attr(kv, observe.AttrReason)
					assert.Equal(t, kvLoadFailed, got)
				}
			}

			got, _ = attr(root, observe.AttrDecision)
			assert.Equal(t, "disaggregated", got)
			got, _ = attr(root, observe.AttrPrefiller)
			assert.Equal(t, "p:1", got)
			got, _ = attr(root, observe.AttrReason)
			assert.Equal(t, tc.reason, got)
			assert.Equal(t, tc.rootStatus, root.Status().Code)
			if tc.rootStatus == codes.Error {
				assert.Equal(t, "status 502", root.Status().Description)
			}
		})
	}
}

// TestEndEndsOpenSpans: a request that ends with its decode leg (and its
// KV handoff) still open ends their spans with its own.
func TestEndEndsOpenSpans(t *testing.T) {
	tr, rec := newTracing(t)
	o := tr.TraceRequest(clientHead("traceparent"), time.Now(), "req-1", "/v1/chat/completions")
	o.StartDecode(true, "p:1")
	o.End("disaggregated", "p:1", "", 499)
	assert.ElementsMatch(t, []string{observe.SpanRequest, observe.SpanKVHandoff, observe.SpanDecode},
		func() (n []string) {
			for s := range byName(t, rec.Ended()) {
				n = append(n, s)
			}
			return n
		}())
}

// TestChildOfTheRequest: a span of the caller's own (an encoder leg's)
// is a child of the request span, and its context is what InjectSpan
// writes.
func TestChildOfTheRequest(t *testing.T) {
	tr, rec := newTracing(t)
	o := tr.TraceRequest(clientHead("traceparent"), time.Now(), "req-1", "/v1/chat/completions")
	ctx, span := o.Child("encode", trace.SpanKindClient)
	require.NotNil(t, span)
	var h fasthttp.RequestHeader
	o.InjectSpan(ctx, &h)
	span.End()
	o.End("local", "", "", fasthttp.StatusOK)
	spans := byName(t, rec.Ended())
	assert.Equal(t, spans[observe.SpanRequest].SpanContext().SpanID(), spans["encode"].Parent().SpanID())
	assert.Equal(t, spans["encode"].SpanContext().SpanID().String(), legParent(t, string(h.Peek("traceparent"))))
}

// TestWithoutTracer: without a tracer there is no tracing feature.
func TestWithoutTracer(t *testing.T) {
	assert.Nil(t, observe.NewTracing(observe.Config{Propagator: propagation.TraceContext{}}))
}

// TestTracingIsAFeature: the tracing feature takes no part at the split's
// points (its part begins at the head) and leaves the propagator's fields
// out of every leg, lower case: each leg carries its own.
func TestTracingIsAFeature(t *testing.T) {
	tests := []struct {
		name string
		prop propagation.TextMapPropagator
		leg  []string
	}{
		{"W3C trace context by default", nil, []string{"traceparent", "tracestate"}},
		{"with baggage",
			propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
			[]string{"traceparent", "tracestate", "baggage"}},
		{"field names are lower cased", upperProp{}, []string{"x-trace-id"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := observe.NewTracing(observe.Config{Tracer: sdktrace.NewTracerProvider().Tracer("t"), Propagator: tc.prop})
			require.NotNil(t, tr)
			assert.ElementsMatch(t, tc.leg, tr.LegDrops()) // a composite propagator's fields come in no order
			assert.Nil(t, tr.Begin(feature.Request{}, clientHead("traceparent")))
		})
	}
}

// upperProp is a propagator whose one field is spelled in capitals.
type upperProp struct{ propagation.TraceContext }

func (upperProp) Fields() []string { return []string{"X-Trace-Id"} }
