package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/spanbatch"
)

// tracerName is the instrumentation scope of the sidecar's spans.
const tracerName = "github.com/pd-sidecar/pd-sidecar/proxy"

// Exporters (OTEL_TRACES_EXPORTER values) and OTLP protocols
// (OTEL_EXPORTER_OTLP_PROTOCOL values) the sidecar speaks.
const (
	exporterOTLP    = "otlp"
	exporterConsole = "console"
	exporterNone    = "none"
	protoGRPC       = "grpc"
	protoHTTP       = "http/protobuf"
	otlpGRPCPort    = "4317"
)

// tracingSetup is what --tracing and the OTEL_* environment select.
type tracingSetup struct {
	// exporters are the span exporters, otlp and/or console; none: off.
	exporters []string
	// protocol is the OTLP protocol, grpc or http/protobuf (with otlp).
	protocol string
	// off says why --tracing was given yet tracing stays off; "" otherwise.
	off string
}

// on reports whether spans are made and exported.
func (s tracingSetup) on() bool { return len(s.exporters) > 0 }

// decideTracing reads the standard OpenTelemetry environment through
// getenv and decides whether tracing is on, with which exporters and, for
// OTLP, which protocol:
//
//   - OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none: off, even with
//     --tracing.
//   - OTEL_TRACES_EXPORTER names exporters (otlp, console; a comma list):
//     on, with --tracing or without it (llm-d-modelservice sets only the
//     environment). Unset or empty: on with otlp under --tracing, else off.
//   - OTLP protocol: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else
//     OTEL_EXPORTER_OTLP_PROTOCOL, else inferred from the endpoint
//     (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT):
//     grpc when none is set (localhost:4317, as llm-d) or its port is 4317,
//     OTLP/gRPC's port; http/protobuf for any other endpoint.
//
// An exporter or protocol the sidecar does not speak is an error.
func decideTracing(flag bool, getenv func(string) string) (tracingSetup, error) {
	var s tracingSetup
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		if flag {
			s.off = "OTEL_SDK_DISABLED=true"
		}
		return s, nil
	}
	raw := getenv("OTEL_TRACES_EXPORTER")
	var names []string
	for _, n := range strings.Split(raw, ",") {
		n = strings.ToLower(strings.TrimSpace(n))
		if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	switch {
	case len(names) == 0 && flag:
		names = []string{exporterOTLP}
	case len(names) == 0:
		return s, nil
	case slices.Contains(names, exporterNone) && len(names) > 1:
		return s, fmt.Errorf("OTEL_TRACES_EXPORTER %q: none cannot be combined with another exporter", raw)
	case names[0] == exporterNone:
		if flag {
			s.off = "OTEL_TRACES_EXPORTER=none"
		}
		return s, nil
	}
	for _, n := range names {
		if n != exporterOTLP && n != exporterConsole {
			return s, fmt.Errorf("OTEL_TRACES_EXPORTER %q: exporter %q is not supported (otlp, console or none)", raw, n)
		}
	}
	s.exporters = names
	if !slices.Contains(names, exporterOTLP) {
		return s, nil
	}
	p, err := otlpProtocol(getenv)
	if err != nil {
		return tracingSetup{}, err
	}
	s.protocol = p
	return s, nil
}

// otlpProtocol is the OTLP protocol decideTracing documents.
func otlpProtocol(getenv func(string) string) (string, error) {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		switch v := strings.TrimSpace(getenv(name)); v {
		case "":
			continue
		case protoGRPC, protoHTTP:
			return v, nil
		case "http/json":
			return "", fmt.Errorf("%s=http/json is not supported: use grpc or http/protobuf", name)
		default:
			return "", fmt.Errorf("%s %q is not an OTLP protocol: use grpc or http/protobuf", name, v)
		}
	}
	endpoint := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
	if endpoint == "" {
		endpoint = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
	}
	if endpoint == "" || endpointPort(endpoint) == otlpGRPCPort {
		return protoGRPC, nil
	}
	return protoHTTP, nil
}

// endpointPort is the port of an OTLP endpoint, a URL
// (http://collector:4317) or a bare host:port; "" when it names none.
func endpointPort(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		u, err = url.Parse("//" + endpoint)
		if err != nil {
			return ""
		}
	}
	return u.Port()
}

// newTracing builds the exporters setup selects and the tracer provider.
// Every other exporter and sampler setting comes from the standard OTEL_*
// environment, read by the OpenTelemetry SDK and exporters themselves
// (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, whose http:// scheme means
// plaintext for gRPC too, ..._HEADERS, ..._INSECURE, ..._CERTIFICATE,
// OTEL_TRACES_SAMPLER[_ARG], OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES...).
// The console exporter writes one JSON object a span to console. The
// returned shutdown flushes pending spans.
func newTracing(ctx context.Context, setup tracingSetup, console io.Writer) (trace.Tracer, propagation.TextMapPropagator, func(context.Context) error, error) {
	// Later resource options win: the environment's service name over ours.
	res, err := sdkresource.New(ctx,
		sdkresource.WithAttributes(attribute.String("service.name", "pd-sidecar")),
		sdkresource.WithFromEnv(), sdkresource.WithHost(), sdkresource.WithTelemetrySDK())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("tracing: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, name := range setup.exporters {
		exp, err := newExporter(ctx, name, setup.protocol, console)
		if err != nil {
			return nil, nil, nil, err
		}
		// Batched without a goroutine wake-up per span (spanbatch).
		opts = append(opts, sdktrace.WithSpanProcessor(spanbatch.New(exp, spanbatch.ConfigFromEnv(2*time.Second, os.Getenv))))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	return tp.Tracer(tracerName), prop, tp.Shutdown, nil
}

// newExporter builds one span exporter.
func newExporter(ctx context.Context, name, protocol string, console io.Writer) (sdktrace.SpanExporter, error) {
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch {
	case name == exporterConsole:
		exp, err = stdouttrace.New(stdouttrace.WithWriter(console))
	case protocol == protoGRPC:
		exp, err = otlptracegrpc.New(ctx)
	default:
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %s exporter: %w", name, err)
	}
	return exp, nil
}

// describe is the tracing setup in words, for the start-up log.
func (s tracingSetup) describe() string {
	var parts []string
	for _, e := range s.exporters {
		if e == exporterOTLP {
			e += " over " + s.protocol
		}
		parts = append(parts, e)
	}
	return strings.Join(parts, ", ")
}

// log writes one start-up line: the exporters when tracing is on, or why
// --tracing was given yet tracing stays off.
func (s tracingSetup) log(l zerolog.Logger) {
	switch {
	case s.on():
		l.Info().Str("exporters", s.describe()).Msg("tracing on")
	case s.off != "":
		l.Warn().Msg("--tracing given, but " + s.off + " keeps tracing off")
	}
}
