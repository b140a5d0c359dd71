package core

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/observe"
)

// TestTracingIsARegisteredFeature: with a tracer, tracing is one of the
// sidecar's features: it traces each request from its head (the request
// span and the decode leg's, each leg carrying its span's context), and
// its legs leave the client's trace context out, beside
// --prefill-strip-headers on prefill legs; without one there is no such
// feature, no request is traced, and no leg leaves the trace context out.
func TestTracingIsARegisteredFeature(t *testing.T) {
	for _, traced := range []bool{true, false} {
		t.Run(map[bool]string{true: "traced", false: "untraced"}[traced], func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.PrefillStripHeaders = []string{"X-Secret"}
			p, err := NewSidecar(cfg, nixlv2.New(), metrics.New(prometheus.NewRegistry(), 0), zerolog.Nop())
			require.NoError(t, err)
			rec := tracetest.NewSpanRecorder()
			if traced {
				p.Observe(nil, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("t"), nil)
			} else {
				p.Observe(nil, nil, nil)
			}
			registered := 0
			for _, f := range p.features {
				if _, ok := f.(*observe.Tracing); ok {
					registered++
				}
			}

			var h fasthttp.RequestHeader
			h.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			r := p.StartRequest(Arrival{ID: []byte("req-1"), Head: &h, Local: "127.0.0.1:8000", API: connectors.APICompletions})
			r.DecodeStarted(false)
			head := r.Legs().AppendTo(nil, false)
			r.Obs.Status = fasthttp.StatusOK
			r.Report()

			if !traced {
				assert.Zero(t, registered)
				assert.Nil(t, r.trace)
				assert.Empty(t, head)
				assert.Empty(t, p.LegStrip)
				assert.Equal(t, []string{"x-secret"}, p.PrefillStrip)
				return
			}
			assert.Equal(t, 1, registered)
			assert.ElementsMatch(t, []string{"traceparent", "tracestate"}, p.LegStrip)
			assert.ElementsMatch(t, []string{"x-secret", "traceparent", "tracestate"}, p.PrefillStrip)
			ended := rec.Ended()
			require.Len(t, ended, 2, "the decode span and the request's")
			decode := ended[0]
			assert.Equal(t, observe.SpanDecode, decode.Name())
			assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", decode.SpanContext().TraceID().String(), "the client's trace goes on")
			assert.Equal(t, "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-"+decode.SpanContext().SpanID().String()+"-01\r\n",
				string(head), "the leg carries its span's context")
			assert.WithinDuration(t, time.Now(), ended[1].EndTime(), time.Minute)
		})
	}
}
