package proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/observe"
)

// fakeEngine answers one fixed body and keeps the traceparent of each
// request it received.
type fakeEngine struct {
	srv    *httptest.Server
	mu     sync.Mutex
	parent []string
}

func newFakeEngine(t *testing.T, status int, body string) *fakeEngine {
	t.Helper()
	e := &fakeEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/health" || r.URL.Path == "/version" || r.URL.Path == "/get_server_info" {
			return // health and the engine-version probe (engineinfo)
		}
		e.mu.Lock()
		e.parent = append(e.parent, r.Header.Get("traceparent"))
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func (e *fakeEngine) traceparents() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.parent...)
}

// reports collects the Observer's reports.
type reports struct {
	mu sync.Mutex
	r  []core.RequestReport
}

func (o *reports) ObserveRequest(r core.RequestReport) {
	o.mu.Lock()
	o.r = append(o.r, r)
	o.mu.Unlock()
}

func (o *reports) all() []core.RequestReport {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]core.RequestReport(nil), o.r...)
}

const (
	prefillAnswer = `{"id":"p","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":"length"}],` +
		`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2]],` +
		`"remote_engine_id":"e1","remote_request_id":"r1","remote_host":"10.0.0.9","remote_port":5600,"tp_size":1}}`
	decodeAnswer = `{"id":"d","object":"text_completion","choices":[{"index":0,"text":"abc","finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7}}`
	clientParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	clientTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
)

// startProxy runs a proxy in front of decode with the given extras.
func startProxy(t *testing.T, decode string, ext inference.Extras) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	host, dport, err := net.SplitHostPort(decode)
	require.NoError(t, err)
	cfg := proxy.DefaultConfig()
	cfg.Host, cfg.Port, cfg.ModelServerHost = "127.0.0.1", port, host
	cfg.ModelServerPort, _ = strconv.Atoi(dport)
	cfg.PrefillTimeout, cfg.ShutdownGrace = 2*time.Second, time.Second
	reg := prometheus.NewRegistry()
	p, err := proxy.New(cfg, nixlv2.New(), metrics.New(reg, 8), reg, zerolog.Nop())
	require.NoError(t, err)
	p.SetExtras(ext)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	url := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 10*time.Millisecond)
	return url
}

func post(t *testing.T, url, prefiller string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"hello world","max_tokens":3}`))
	require.NoError(t, err)
	req.Header.Set("traceparent", clientParent)
	if prefiller != "" {
		req.Header.Set(core.HeaderPrefiller, prefiller)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value.String()
		}
	}
	return ""
}

func byName(spans []sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	m := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		m[s.Name()] = s
	}
	return m
}

// parentOf is the span id a traceparent header names, and its trace id.
func parentOf(t *testing.T, tp string) (traceID, spanID string) {
	t.Helper()
	parts := strings.Split(tp, "-")
	require.Len(t, parts, 4, "traceparent %q", tp)
	return parts[1], parts[2]
}

func TestTracingAndReports(t *testing.T) {
	tests := []struct {
		name          string
		prefillStatus int
		prefiller     bool
		decision      string
		reason        string
		spans         []string
		kvMoved       bool
	}{
		{"split", http.StatusOK, true, metrics.ModeDisaggregated, "",
			[]string{observe.SpanRequest, observe.SpanPrefill, observe.SpanKVHandoff, observe.SpanDecode}, true},
		{"prefiller 5xx falls back", http.StatusServiceUnavailable, true, metrics.ModeFallback, failure.ReasonServerError,
			[]string{observe.SpanRequest, observe.SpanPrefill, observe.SpanDecode}, false},
		{"no prefiller", http.StatusOK, false, metrics.ModeLocal, "",
			[]string{observe.SpanRequest, observe.SpanDecode}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pre := newFakeEngine(t, tc.prefillStatus, prefillAnswer)
			dec := newFakeEngine(t, http.StatusOK, decodeAnswer)
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			obs := &reports{}
			url := startProxy(t, dec.addr(), inference.Extras{Tracer: tp.Tracer("test"), Observer: obs})
			named := ""
			if tc.prefiller {
				named = pre.addr()
			}
			require.Equal(t, http.StatusOK, post(t, url, named))

			require.Eventually(t, func() bool { return len(obs.all()) == 1 }, 30*time.Second, 5*time.Millisecond)
			rep := obs.all()[0]
			assert.Equal(t, tc.decision, rep.Mode)
			assert.Equal(t, tc.reason, rep.Reason)
			assert.Equal(t, http.StatusOK, rep.Status)
			assert.Equal(t, tc.kvMoved, rep.KVTransferred)
			assert.Equal(t, tc.prefiller, rep.PrefillDuration > 0)

			spans := byName(rec.Ended())
			var names []string
			for n := range spans {
				names = append(names, n)
			}
			assert.ElementsMatch(t, tc.spans, names)
			root := spans[observe.SpanRequest]
			require.NotNil(t, root)
			assert.Equal(t, clientTrace, root.SpanContext().TraceID().String(), "the client's trace continues")
			assert.Equal(t, "00f067aa0ba902b7", root.Parent().SpanID().String())
			assert.Equal(t, trace.SpanKindServer, root.SpanKind())
			assert.Equal(t, tc.decision, attr(root, observe.AttrDecision))
			assert.Equal(t, tc.reason, attr(root, observe.AttrReason))
			for _, s := range rec.Ended() {
				assert.Equal(t, clientTrace, s.SpanContext().TraceID().String(), s.Name())
			}

			// Each leg carried a traceparent naming its own span.
			decTP := dec.traceparents()
			require.Len(t, decTP, 1)
			tid, sid := parentOf(t, decTP[0])
			assert.Equal(t, clientTrace, tid)
			assert.Equal(t, spans[observe.SpanDecode].SpanContext().SpanID().String(), sid)
			if tc.prefiller {
				preTP := pre.traceparents()
				require.NotEmpty(t, preTP)
				tid, sid := parentOf(t, preTP[0])
				assert.Equal(t, clientTrace, tid)
				assert.Equal(t, spans[observe.SpanPrefill].SpanContext().SpanID().String(), sid)
				assert.Equal(t, tc.reason, attr(spans[observe.SpanPrefill], observe.AttrReason))
			}
		})
	}
}

func TestNoTracerPassesTraceparentThrough(t *testing.T) {
	pre := newFakeEngine(t, http.StatusOK, prefillAnswer)
	dec := newFakeEngine(t, http.StatusOK, decodeAnswer)
	obs := &reports{}
	url := startProxy(t, dec.addr(), inference.Extras{Observer: obs})
	require.Equal(t, http.StatusOK, post(t, url, pre.addr()))
	assert.Equal(t, []string{clientParent}, pre.traceparents())
	assert.Equal(t, []string{clientParent}, dec.traceparents())
	require.Eventually(t, func() bool { return len(obs.all()) == 1 }, 30*time.Second, 5*time.Millisecond)
	assert.True(t, obs.all()[0].KVTransferred)
}
