package e2e

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/status"
)

// TestDebugPDAndStatusCommand drives real traffic and reads the verdict
// from GET /debug/pd and from `pd-sidecar status --url`: no prefiller
// named → not-configured; a dead prefiller → not-operating, in words, with
// the reason; real splits after it → degraded, with the last split and KV
// transfer.
func TestDebugPDAndStatusCommand(t *testing.T) {
	rig := newRig(t)
	url := rig.sc.URL()
	snap := func() status.Snapshot {
		s, err := status.Fetch(context.Background(), nil, url)
		require.NoError(t, err)
		return s
	}
	s := snap()
	assert.Equal(t, status.VerdictIdle, s.Verdict)
	assert.Equal(t, "nixlv2", s.Connector)

	st, _, _ := scPost(t, url+"/v1/completions", completionBody(`,"max_tokens":4`), nil)
	require.Equal(t, http.StatusOK, st)
	s = snap()
	assert.Equal(t, status.VerdictNotConfigured, s.Verdict)
	assert.Equal(t, 1, s.Window.Local)

	dead := map[string]string{"x-prefiller-host-port": harness.HostPort(harness.FreePort(t))}
	st, _, _ = scPost(t, url+"/v1/completions", completionBody(`,"max_tokens":4`), dead)
	require.Equal(t, http.StatusOK, st, "a dead prefiller degrades, never fails")
	s = snap()
	assert.Equal(t, status.VerdictNotOperating, s.Verdict)
	assert.Contains(t, s.Summary, "no split happened")
	assert.Equal(t, 1, s.Window.FallbacksByReason["unreachable"])
	assert.Nil(t, s.LastSplit)

	before := rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil)
	for range 3 {
		st, _, _ = scPost(t, url+"/v1/completions", completionBody(`,"max_tokens":4`), rig.header())
		require.Equal(t, http.StatusOK, st)
	}
	s = snap()
	assert.Equal(t, 3, s.Window.Disaggregated)
	assert.Equal(t, 3, s.Window.KVTransferred)
	assert.Equal(t, status.VerdictDegraded, s.Verdict, "one fallback is still in the window")
	require.NotNil(t, s.LastSplit)
	require.NotNil(t, s.LastKVTransfer)
	var pf *status.Prefiller
	for i := range s.Prefillers {
		if s.Prefillers[i].Prefiller == rig.prefill.HostPort() {
			pf = &s.Prefillers[i]
		}
	}
	require.NotNil(t, pf, "%+v", s.Prefillers)
	assert.Equal(t, 3, pf.Splits)
	assert.Positive(t, pf.PrefillP50Ms)
	assert.Equal(t, "closed", pf.Circuit, "the breaker (on by default) reports its state")
	// The tracker's count matches the decode engine's proof counter, which
	// moves only when a decode really ran on remote KV.
	assert.Equal(t, float64(s.Window.KVTransferred), rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil)-before)
	assert.Equal(t, 3.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated"}))

	out, err := exec.Command(harness.Binary(t, "pd-sidecar"), "status", "--url", url).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, want := range []string{"DEGRADED:", "disaggregated:", "unreachable: 1", rig.prefill.HostPort(), "last kv transfer:"} {
		assert.Contains(t, string(out), want)
	}
	out, err = exec.Command(harness.Binary(t, "pd-sidecar"), "status", "--url", harness.URL(harness.FreePort(t))).CombinedOutput()
	require.Error(t, err, "an unreachable sidecar is an error: %s", out)
}

// otlpSink is an OTLP/HTTP trace receiver: it keeps the spans exported to it.
type otlpSink struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans map[string]string // span name -> trace id (hex)
	attrs map[string]map[string]string
}

func newOTLPSink(t *testing.T) *otlpSink {
	t.Helper()
	s := &otlpSink{spans: map[string]string{}, attrs: map[string]map[string]string{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil || r.URL.Path != "/v1/traces" {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					s.spans[sp.GetName()] = hexOf(sp.GetTraceId())
					a := map[string]string{}
					for _, kv := range sp.GetAttributes() {
						a[kv.GetKey()] = kv.GetValue().GetStringValue()
					}
					s.attrs[sp.GetName()] = a
				}
			}
		}
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *otlpSink) get(name string) (string, map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spans[name], s.attrs[name]
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	var sb strings.Builder
	for _, c := range b {
		sb.WriteByte(digits[c>>4])
		sb.WriteByte(digits[c&15])
	}
	return sb.String()
}

// TestTracingOverOTLP runs the sidecar with --tracing, exporting to an
// OTLP/HTTP receiver configured only through OTEL_* variables, and checks
// that both legs carried the client's trace (engine-sim's request journal)
// and that the prefill, kv_handoff and decode spans were exported with the
// decision; then the same of a local request. On both serving paths: with
// tracing on, the event loops (the lane) serve both requests, as
// pd_sidecar_loop_requests_total shows, and fasthttp's path with
// --stream-loops=0.
func TestTracingOverOTLP(t *testing.T) {
	for _, path := range []struct {
		name    string
		flags   []string
		onLoops float64
	}{{"lane", nil, 2}, {"stream-loops=0", []string{"--stream-loops=0"}, 0}} {
		t.Run(path.name, func(t *testing.T) {
			sink := newOTLPSink(t)
			prefill := harness.StartEngineSim(t, "prefill")
			decode := harness.StartEngineSim(t, "decode")
			sc := startTracedSidecar(t, sink, decode.Port, path.flags...)

			const trace = "0af7651916cd43dd8448eb211c80319c"
			hdr := map[string]string{
				"x-prefiller-host-port": prefill.HostPort(),
				"traceparent":           "00-" + trace + "-b7ad6b7169203331-01",
			}
			st, _, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`), hdr)
			require.Equal(t, http.StatusOK, st)
			require.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated"}))
			assert.Equal(t, 1.0, decode.Metric(t, "sim_remote_kv_decodes_total", nil), "the split happened")

			legs := map[string]*harness.Engine{"prefill": prefill, "decode": decode}
			for name, e := range legs {
				id, parent := legTrace(t, e, 1, name)
				assert.Equal(t, trace, id, "%s leg continues the client's trace", name)
				assert.NotEqual(t, "b7ad6b7169203331", parent, "%s leg's parent is the sidecar's span", name)
			}
			for _, name := range []string{"pd-sidecar.request", "prefill", "kv_handoff", "decode"} {
				harness.Eventually(t, 30*time.Second, "span "+name, func() bool {
					id, _ := sink.get(name)
					return id == trace
				})
			}
			_, root := sink.get("pd-sidecar.request")
			assert.Equal(t, "disaggregated", root["pd.decision"])
			assert.Equal(t, prefill.HostPort(), root["pd.prefiller"])

			// A local request: its one leg continues its own trace.
			const local = "3cf7651916cd43dd8448eb211c80319e"
			st, _, _ = scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`),
				map[string]string{"Traceparent": "00-" + local + "-d7ad6b7169203333-01"})
			require.Equal(t, http.StatusOK, st)
			id, _ := legTrace(t, decode, 2, "the local")
			assert.Equal(t, local, id, "the local leg continues the client's trace")
			for _, name := range []string{"pd-sidecar.request", "decode"} {
				harness.Eventually(t, 30*time.Second, "span "+name+" of the local request", func() bool {
					id, _ := sink.get(name)
					return id == local
				})
			}
			_, root = sink.get("pd-sidecar.request")
			assert.Equal(t, "local", root["pd.decision"])
			assert.Equal(t, path.onLoops, sc.Metric(t, "pd_sidecar_loop_requests_total", nil), "the serving path")
		})
	}
}

// TestTracingConcurrentChoreography: under sglang (both legs at once) the
// prefill leg gets its own span too, and each leg carries the trace.
func TestTracingConcurrentChoreography(t *testing.T) {
	sink := newOTLPSink(t)
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	sc := startTracedSidecar(t, sink, decode.Port, "--kv-connector", "sglang",
		"--sglang-bootstrap-port", itoa(prefill.BootstrapPort))

	const trace = "1bf7651916cd43dd8448eb211c80319d"
	hdr := map[string]string{
		"x-prefiller-host-port": prefill.HostPort(),
		"traceparent":           "00-" + trace + "-c7ad6b7169203332-01",
	}
	st, _, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":4`), hdr)
	require.Equal(t, http.StatusOK, st)
	assert.Equal(t, 1.0, decode.Metric(t, "sim_sglang_decodes_total", nil), "the split happened")
	parents := map[string]string{}
	for name, e := range map[string]*harness.Engine{"prefill": prefill, "decode": decode} {
		id, parent := legTrace(t, e, 1, name)
		assert.Equal(t, trace, id, "%s leg continues the client's trace", name)
		parents[name] = parent
	}
	assert.NotEqual(t, parents["prefill"], parents["decode"], "each leg is the child of its own span")
	for _, name := range []string{"pd-sidecar.request", "prefill", "decode"} {
		harness.Eventually(t, 30*time.Second, "span "+name, func() bool {
			id, _ := sink.get(name)
			return id == trace
		})
	}
}

// legTrace is the trace id and parent span id of the traceparent of the
// last of the n requests engine e has seen (the named leg), which carries
// exactly one.
func legTrace(t *testing.T, e *harness.Engine, n int, name string) (id, parent string) {
	t.Helper()
	reqs := simRequests(t, e)
	require.Len(t, reqs, n, name)
	tp := reqs[n-1].Headers["traceparent"]
	require.Len(t, tp, 1, "%s leg carries exactly one traceparent", name)
	parts := strings.Split(tp[0], "-")
	require.Len(t, parts, 4)
	return parts[1], parts[2]
}

// startTracedSidecar starts a sidecar with --tracing exporting to sink
// (OTLP/HTTP, every span sampled, exported every 100 ms).
func startTracedSidecar(t *testing.T, sink *otlpSink, modelServerPort int, flags ...string) *harness.Sidecar {
	t.Helper()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	return harness.StartSidecar(t, modelServerPort, append([]string{"--tracing"}, flags...)...)
}
