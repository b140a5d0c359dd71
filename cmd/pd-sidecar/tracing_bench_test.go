package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/proxy/observe"
)

// BenchmarkTracingFloor is what tracing one local request costs the
// process in CPU (cpu-µs/op: user and system time of the whole process,
// the batch span processor's export and the in-process OTLP sink's read
// included), with the sidecar's own tracer provider exporting over
// OTLP/HTTP as under --tracing:
//
//   - sdk: the OpenTelemetry SDK alone, the two spans a local request
//     has (the request's, server kind, two attributes; its decode leg's,
//     client kind, one), started and ended, nothing of the sidecar's;
//   - sidecar: the same two spans through the tracing feature
//     (observe.Tracing): the request's trace opened from the client's
//     traceparent, the decode span, the leg's trace context written on a
//     raw head, the end with the request's mode and status.
//
// The difference is what the sidecar's own code adds; sdk is the floor no
// code of the sidecar's can go under while it exports every span.
func BenchmarkTracingFloor(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer sink.Close()
	b.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", sink.URL+"/v1/traces")
	b.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "1048576") // every span exported: a tight loop outruns any export
	setup := tracingSetup{exporters: []string{exporterOTLP}, protocol: protoHTTP}

	var in fasthttp.RequestHeader
	in.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	cases := []struct {
		name string
		run  func(tracer trace.Tracer, t *observe.Tracing, head []byte) []byte
	}{
		{"sdk", func(tracer trace.Tracer, _ *observe.Tracing, head []byte) []byte {
			ctx, root := tracer.Start(context.Background(), observe.SpanRequest, trace.WithSpanKind(trace.SpanKindServer),
				trace.WithAttributes(observe.AttrRequestID.String("req-1"), attribute.String("http.route", "/v1/completions")))
			_, dec := tracer.Start(ctx, observe.SpanDecode, trace.WithSpanKind(trace.SpanKindClient),
				trace.WithAttributes(observe.AttrRemoteKV.Bool(false)))
			dec.End()
			root.End()
			return head
		}},
		{"sidecar", func(_ trace.Tracer, t *observe.Tracing, head []byte) []byte {
			o := t.TraceRequest(&in, time.Now(), "req-1", "/v1/completions")
			o.StartDecode(false, "")
			head = o.AppendTrace(head[:0])
			o.End("local", "", "", fasthttp.StatusOK)
			return head
		}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			tracer, prop, shutdown, err := newTracing(context.Background(), setup, io.Discard)
			if err != nil {
				b.Fatal(err)
			}
			t := observe.NewTracing(observe.Config{Tracer: tracer, Propagator: prop})
			var head []byte
			before := cpuTime()
			b.ReportAllocs()
			for b.Loop() {
				head = tc.run(tracer, t, head)
			}
			if err := shutdown(context.Background()); err != nil { // the last batch exported
				b.Fatal(err)
			}
			b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
