package e2e

import (
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest/modelservice"
	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// clearOTELEnv unsets, for the test, the OTEL_* variables that would
// change the sidecar's tracing decision, so that a test's environment is
// exactly what it sets.
func clearOTELEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"} {
		t.Setenv(k, "") // restored at cleanup
		require.NoError(t, os.Unsetenv(k))
	}
}

// listenOTLPGRPCPort listens on port 4317, OTLP/gRPC's, on the first free
// loopback address of 127.0.0.1-127.0.0.32 (all of 127/8 is loopback).
func listenOTLPGRPCPort(t *testing.T) net.Listener {
	t.Helper()
	for i := 1; i <= 32; i++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0."+itoa(i), "4317"))
		if err == nil {
			return l
		}
	}
	t.Fatal("no loopback address has port 4317 free")
	return nil
}

// TestModelserviceTracingEnvOverGRPC starts the real sidecar with the
// argument list and the environment llm-d's modelservice chart renders
// with tracing.enabled (deploy/rendertest/testdata/llm-d-modelservice.json,
// case "tracing enabled"): no --tracing, only OTEL_* variables, the
// endpoint http://otel-collector:4317 and no protocol. The only changes:
// the ports, and the collector's host, a loopback address whose port 4317
// serves an OTLP/gRPC receiver. The request's spans arrive there over
// gRPC, under the chart's service name, in the client's trace.
func TestModelserviceTracingEnvOverGRPC(t *testing.T) {
	f, err := modelservice.Load()
	require.NoError(t, err)
	var tc *modelservice.Case
	for i := range f.Cases {
		if f.Cases[i].Name == "tracing enabled" {
			tc = &f.Cases[i]
		}
	}
	require.NotNil(t, tc, "the fixture has the tracing case")
	require.NotEmpty(t, tc.Container.Env)

	l := listenOTLPGRPCPort(t)
	recv := harness.StartOTLPReceiver(t, l)
	host, _, err := net.SplitHostPort(recv.Addr)
	require.NoError(t, err)
	clearOTELEnv(t)
	env := map[string]string{}
	for _, e := range tc.Container.Env {
		v := e.Value
		if e.Name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			u, err := url.Parse(v)
			require.NoError(t, err)
			require.Equal(t, "4317", u.Port(), "the chart's collector port")
			u.Host = net.JoinHostPort(host, u.Port())
			v = u.String()
		}
		env[e.Name] = v
		t.Setenv(e.Name, v)
	}
	assert.Equal(t, "routing-proxy", env["OTEL_SERVICE_NAME"])
	assert.Equal(t, "otlp", env["OTEL_TRACES_EXPORTER"])
	assert.NotContains(t, env, "OTEL_EXPORTER_OTLP_PROTOCOL")

	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	port := harness.FreePorts(t, 4)
	var args []string
	for _, a := range tc.Container.Args {
		k, _, _ := strings.Cut(a, "=")
		require.NotEqual(t, "--tracing", k, "the chart renders no --tracing")
		switch k {
		case "--port":
			a = k + "=" + itoa(port)
		case "--vllm-port":
			a = k + "=" + itoa(decode.Port)
		}
		args = append(args, a)
	}
	sc := harness.Start(t, harness.Binary(t, "pd-sidecar"), args...)
	sc.WaitHTTP(t, harness.URL(port)+"/health", 30*time.Second)
	assert.Contains(t, sc.Output(), "otlp over grpc", "the start-up line names the exporter")

	const trace = "2cf7651916cd43dd8448eb211c80319e"
	hdr := map[string]string{
		"x-prefiller-host-port": prefill.HostPort(),
		"traceparent":           "00-" + trace + "-d7ad6b7169203333-01",
	}
	st, _, _ := scPost(t, harness.URL(port)+"/v1/completions", completionBody(`,"max_tokens":4`), hdr)
	require.Equal(t, http.StatusOK, st)
	for _, name := range []string{"pd-sidecar.request", "prefill", "kv_handoff", "decode"} {
		harness.Eventually(t, 30*time.Second, "span "+name+" over OTLP/gRPC", func() bool {
			sp, ok := recv.Span(name)
			return ok && sp.TraceID == trace
		})
		sp, _ := recv.Span(name)
		assert.Equal(t, "routing-proxy", sp.Service, "span %s: OTEL_SERVICE_NAME names the service", name)
	}
	root, _ := recv.Span("pd-sidecar.request")
	assert.Equal(t, "disaggregated", root.Attrs["pd.decision"])
	assert.Equal(t, prefill.HostPort(), root.Attrs["pd.prefiller"])
}

// TestTracingConsoleExporter: OTEL_TRACES_EXPORTER=console alone turns
// tracing on, and each span is one JSON line on the sidecar's stdout.
func TestTracingConsoleExporter(t *testing.T) {
	clearOTELEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "console")
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	sc := harness.StartSidecar(t, decode.Port)

	const trace = "3df7651916cd43dd8448eb211c80319f"
	hdr := map[string]string{
		"x-prefiller-host-port": prefill.HostPort(),
		"traceparent":           "00-" + trace + "-e7ad6b7169203334-01",
	}
	st, _, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`), hdr)
	require.Equal(t, http.StatusOK, st)
	require.NoError(t, sc.Signal(syscall.SIGTERM))
	code, err := sc.Wait(15 * time.Second)
	require.NoError(t, err)
	require.Equal(t, 0, code)
	names := map[string]bool{}
	for _, line := range strings.Split(sc.Output(), "\n") {
		var span struct {
			Name        string
			SpanContext struct{ TraceID string }
		}
		if json.Unmarshal([]byte(line), &span) == nil && span.SpanContext.TraceID == trace {
			names[span.Name] = true
		}
	}
	for _, name := range []string{"pd-sidecar.request", "prefill", "kv_handoff", "decode"} {
		assert.True(t, names[name], "span %s on stdout:\n%s", name, sc.Output())
	}
}

// TestTracingNoneKeepsFlagOff: --tracing with OTEL_TRACES_EXPORTER=none
// exports nothing, even at shutdown, and says so in one log line.
func TestTracingNoneKeepsFlagOff(t *testing.T) {
	clearOTELEnv(t)
	sink := newOTLPSink(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	sc := harness.StartSidecar(t, decode.Port, "--tracing")

	hdr := map[string]string{"x-prefiller-host-port": prefill.HostPort()}
	st, _, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`), hdr)
	require.Equal(t, http.StatusOK, st)
	require.NoError(t, sc.Signal(syscall.SIGTERM))
	code, err := sc.Wait(15 * time.Second)
	require.NoError(t, err)
	require.Equal(t, 0, code)
	for _, name := range []string{"pd-sidecar.request", "prefill", "decode"} {
		id, _ := sink.get(name)
		assert.Empty(t, id, "span %s exported", name)
	}
	assert.Equal(t, 1, strings.Count(sc.Output(), "--tracing given, but OTEL_TRACES_EXPORTER=none keeps tracing off"), sc.Output())
	assert.NotContains(t, sc.Output(), "tracing on")
}
