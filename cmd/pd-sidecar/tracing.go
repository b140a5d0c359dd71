package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the sidecar's spans.
const tracerName = "github.com/pd-sidecar/pd-sidecar/proxy"

// newTracing builds the OTLP/HTTP exporter and tracer provider for
// --tracing. Every exporter and sampler setting comes from the standard
// OTEL_* environment, read by the OpenTelemetry SDK itself
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
// OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES...). The returned shutdown
// flushes pending spans.
func newTracing(ctx context.Context) (trace.Tracer, propagation.TextMapPropagator, func(context.Context) error, error) {
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--tracing: OTLP exporter: %w", err)
	}
	res, err := sdkresource.New(ctx,
		sdkresource.WithAttributes(attribute.String("service.name", "pd-sidecar")),
		sdkresource.WithFromEnv(), sdkresource.WithHost(), sdkresource.WithTelemetrySDK())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(2*time.Second)),
		sdktrace.WithResource(res))
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	return tp.Tracer(tracerName), prop, tp.Shutdown, nil
}
