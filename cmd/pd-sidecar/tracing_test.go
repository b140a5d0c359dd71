package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestDecideTracing: --tracing or OTEL_TRACES_EXPORTER turns tracing on,
// none and OTEL_SDK_DISABLED keep it off, and the OTLP protocol comes from
// the protocol variables or else from the endpoint's port.
func TestDecideTracing(t *testing.T) {
	chart := map[string]string{ // llm-d-modelservice's tracing.enabled
		"OTEL_SERVICE_NAME":           "routing-proxy",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4317",
		"OTEL_TRACES_EXPORTER":        "otlp",
		"OTEL_TRACES_SAMPLER":         "parentbased_traceidratio",
		"OTEL_TRACES_SAMPLER_ARG":     "1.0",
	}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range chart {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name      string
		flag      bool
		env       map[string]string
		exporters []string
		protocol  string
		off       string
		err       string
	}{
		{name: "nothing: off"},
		{name: "--tracing alone: otlp over grpc to localhost:4317", flag: true,
			exporters: []string{"otlp"}, protocol: "grpc"},
		{name: "modelservice's environment without --tracing", env: chart,
			exporters: []string{"otlp"}, protocol: "grpc"},
		{name: "modelservice's environment with --tracing", flag: true, env: chart,
			exporters: []string{"otlp"}, protocol: "grpc"},
		{name: "our chart: --tracing and an :4318 endpoint", flag: true,
			env:       map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.monitoring:4318"},
			exporters: []string{"otlp"}, protocol: "http/protobuf"},
		{name: "endpoint on another port: http/protobuf", flag: true,
			env:       map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.example.com"},
			exporters: []string{"otlp"}, protocol: "http/protobuf"},
		{name: "bare host:port 4317: grpc", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"},
			exporters: []string{"otlp"}, protocol: "grpc"},
		{name: "the traces endpoint wins over the general one", env: with("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/v1/traces"),
			exporters: []string{"otlp"}, protocol: "http/protobuf"},
		{name: "protocol wins over the port", env: with("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
			exporters: []string{"otlp"}, protocol: "http/protobuf"},
		{name: "traces protocol wins over protocol", env: with("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
			exporters: []string{"otlp"}, protocol: "grpc"},
		{name: "console", env: map[string]string{"OTEL_TRACES_EXPORTER": "console"},
			exporters: []string{"console"}},
		{name: "console and otlp, case and spaces", env: map[string]string{"OTEL_TRACES_EXPORTER": " Console , otlp,console", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
			exporters: []string{"console", "otlp"}, protocol: "http/protobuf"},
		{name: "none keeps --tracing off", flag: true, env: map[string]string{"OTEL_TRACES_EXPORTER": "none"},
			off: "OTEL_TRACES_EXPORTER=none"},
		{name: "none without --tracing: off, nothing to say", env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}},
		{name: "OTEL_SDK_DISABLED keeps --tracing off", flag: true, env: with("OTEL_SDK_DISABLED", "TRUE"),
			off: "OTEL_SDK_DISABLED=true"},
		{name: "OTEL_SDK_DISABLED=false changes nothing", env: with("OTEL_SDK_DISABLED", "false"),
			exporters: []string{"otlp"}, protocol: "grpc"},
		{name: "http/json", env: with("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
			err: "OTEL_EXPORTER_OTLP_PROTOCOL=http/json is not supported: use grpc or http/protobuf"},
		{name: "unknown traces protocol", env: with("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "udp"),
			err: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL "udp" is not an OTLP protocol: use grpc or http/protobuf`},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"},
			err: `OTEL_TRACES_EXPORTER "zipkin": exporter "zipkin" is not supported (otlp, console or none)`},
		{name: "none with another", flag: true, env: map[string]string{"OTEL_TRACES_EXPORTER": "none,otlp"},
			err: `OTEL_TRACES_EXPORTER "none,otlp": none cannot be combined with another exporter`},
		{name: "console only ignores the OTLP protocol", env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
			exporters: []string{"console"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decideTracing(tt.flag, func(k string) string { return tt.env[k] })
			if tt.err != "" {
				require.EqualError(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.exporters, got.exporters)
			assert.Equal(t, tt.protocol, got.protocol)
			assert.Equal(t, tt.off, got.off)
			assert.Equal(t, len(tt.exporters) > 0, got.on())
		})
	}
}

// TestRunRejectsBadTracingEnv: an exporter or protocol the sidecar does
// not speak exits 2 with one line, before anything starts.
func TestRunRejectsBadTracingEnv(t *testing.T) {
	for _, tt := range []struct{ env, value, want string }{
		{"OTEL_TRACES_EXPORTER", "zipkin", `exporter "zipkin" is not supported`},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json is not supported"},
	} {
		t.Run(tt.value, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
			t.Setenv(tt.env, tt.value)
			var stdout, stderr bytes.Buffer
			assert.Equal(t, exitUsage, run([]string{"--tracing"}, &stdout, &stderr))
			assert.Contains(t, stderr.String(), tt.want)
			assert.Equal(t, 1, strings.Count(stderr.String(), "\n"), stderr.String())
		})
	}
}

// consoleSpans runs newTracing with the console exporter, ends one span,
// flushes, and returns the exported spans as decoded JSON lines.
func consoleSpans(t *testing.T) []map[string]any {
	t.Helper()
	var buf bytes.Buffer
	setup, err := decideTracing(false, func(k string) string {
		if k == "OTEL_TRACES_EXPORTER" {
			return "console"
		}
		return ""
	})
	require.NoError(t, err)
	tracer, _, shutdown, err := newTracing(context.Background(), setup, &buf)
	require.NoError(t, err)
	_, span := tracer.Start(context.Background(), "probe")
	span.End()
	require.NoError(t, shutdown(context.Background()))
	var spans []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "one JSON object a line: %q", line)
		spans = append(spans, m)
	}
	return spans
}

// resourceAttr is a string attribute of a console span's resource.
func resourceAttr(t *testing.T, span map[string]any, key string) string {
	t.Helper()
	attrs, _ := span["Resource"].([]any)
	for _, a := range attrs {
		kv, _ := a.(map[string]any)
		if kv["Key"] == key {
			v, _ := kv["Value"].(map[string]any)
			s, _ := v["Value"].(string)
			return s
		}
	}
	return ""
}

// TestTracingServiceName: OTEL_SERVICE_NAME wins over service.name in
// OTEL_RESOURCE_ATTRIBUTES, which wins over our default pd-sidecar; the
// console exporter writes each span as one JSON line.
func TestTracingServiceName(t *testing.T) {
	tests := []struct {
		name, serviceName, resourceAttrs, want string
	}{
		{name: "default", want: "pd-sidecar"},
		{name: "OTEL_SERVICE_NAME", serviceName: "routing-proxy", want: "routing-proxy"},
		{name: "OTEL_RESOURCE_ATTRIBUTES", resourceAttrs: "service.name=from-attrs,team=x", want: "from-attrs"},
		{name: "both", serviceName: "routing-proxy", resourceAttrs: "service.name=from-attrs", want: "routing-proxy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("OTEL_SERVICE_NAME", tt.serviceName)
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", tt.resourceAttrs)
			spans := consoleSpans(t)
			require.Len(t, spans, 1)
			assert.Equal(t, "probe", spans[0]["Name"])
			assert.Equal(t, tt.want, resourceAttr(t, spans[0], "service.name"))
		})
	}
}

// TestGRPCEndpointScheme: the OTLP/gRPC exporter reads the endpoint from
// the environment itself, and its http:// scheme means plaintext (a
// plaintext receiver gets the span), https:// TLS (the same receiver gets
// nothing: the handshake fails, and the exporter drops the batch).
func TestGRPCEndpointScheme(t *testing.T) {
	for _, tt := range []struct {
		scheme   string
		received bool
	}{{"http", true}, {"https", false}} {
		t.Run(tt.scheme, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			recv := harness.StartOTLPReceiver(t, l)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tt.scheme+"://"+recv.Addr)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
			t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2000")
			setup, err := decideTracing(true, os.Getenv)
			require.NoError(t, err)
			require.Equal(t, "grpc", setup.protocol)
			tracer, _, shutdown, err := newTracing(context.Background(), setup, nil)
			require.NoError(t, err)
			_, span := tracer.Start(context.Background(), "probe")
			span.End()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = shutdown(ctx)
			got, ok := recv.Span("probe")
			if !tt.received {
				assert.False(t, ok, "a TLS client reached the plaintext receiver")
				return
			}
			require.NoError(t, err)
			require.True(t, ok, "the span arrived over gRPC")
			assert.Equal(t, "pd-sidecar", got.Service)
		})
	}
}
