package core

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// BenchmarkRequestObservation is one split request's observation: its
// spans begun from the client's traceparent, the prefill leg's and the
// decode leg's trace context written (on a fasthttp head and on a lane
// head), the KV handoff and the report; without a tracer, with a no-op
// one, and with the SDK's (sampled, no exporter).
func BenchmarkRequestObservation(b *testing.B) {
	tracers := []struct {
		name   string
		tracer trace.Tracer
	}{
		{"off", nil},
		{"noop", noop.NewTracerProvider().Tracer("b")},
		{"sdk", sdktrace.NewTracerProvider().Tracer("b")},
	}
	for _, tc := range tracers {
		b.Run(tc.name, func(b *testing.B) {
			p := &Sidecar{Cfg: DefaultConfig(), M: metrics.New(prometheus.NewRegistry(), 0), Log: zerolog.Nop()}
			p.Observe(nopObserver{}, tc.tracer, nil)
			var in, leg fasthttp.RequestHeader
			in.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			id := []byte("0123456789abcdef")
			var head []byte
			fail := errors.New("refused")
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				r := p.StartRequest(Arrival{ID: id, Head: &in, Local: "127.0.0.1:8000", API: connectors.APICompletions})
				r.Label, r.Prefiller, r.Mode = "p:1", "p:1", metrics.ModeDisaggregated
				end := r.PrefillStarted(time.Now())
				leg.Reset()
				spec := r.Legs()
				if spec.Trace != nil {
					spec.Trace.Inject(&leg)
				}
				if i%8 == 0 {
					end(fail)
				} else {
					end(nil)
				}
				r.DecodeStarted(true)
				head = r.Legs().AppendTo(head[:0], false)
				r.KVHandoffDone(time.Now(), true)
				r.Obs.Status = fasthttp.StatusOK
				r.Report()
				r.Cancel(nil)
			}
		})
	}
}

type nopObserver struct{}

func (nopObserver) ObserveRequest(RequestReport) {}
