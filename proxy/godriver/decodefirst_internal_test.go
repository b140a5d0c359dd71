package godriver

import (
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
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors/sharedstorage"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/front"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// firstEngine is an engine that serves as decoder and prefiller of the
// shared-storage connector: a leg with a cache_hit_threshold other than 0
// is the decode-first leg, answered as first says; a one-token leg with
// threshold 0 the prefill; any other the decode after it.
type firstEngine struct {
	first func(w http.ResponseWriter)

	mu   sync.Mutex
	legs []string // "first", "prefill", "decode", in order
}

func (e *firstEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	th := gjson.GetBytes(b, "cache_hit_threshold")
	leg := "decode"
	switch {
	case th.Exists() && th.Raw != "0":
		leg = "first"
	case gjson.GetBytes(b, "max_tokens").Int() == 1 && !gjson.GetBytes(b, "stream").Bool():
		leg = "prefill"
	}
	e.mu.Lock()
	e.legs = append(e.legs, leg)
	e.mu.Unlock()
	switch leg {
	case "first":
		e.first(w)
	case "prefill":
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"p","finish_reason":"length"}],"usage":{"prompt_tokens":3}}`)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"text":"after prefill","finish_reason":"length"}]}`)
	}
}

func (e *firstEngine) seen() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.legs...)
}

func jsonAnswer(status int, body string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func sseAnswer(events ...string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			_, _ = io.WriteString(w, "data: "+ev+"\n\n")
			w.(http.Flusher).Flush()
		}
	}
}

// TestDecodeFirstDriver runs decode-first requests through the proxy's
// handler against one engine: a served answer is relayed and no prefill
// runs; a declined one runs the split with cache_hit_threshold 0; a leg
// that fails before output is answered as an error. Each is counted as
// before.
func TestDecodeFirstDriver(t *testing.T) {
	const (
		declinedJSON = `{"choices":[{"text":"","finish_reason":"cache_threshold"}]}`
		servedJSON   = `{"choices":[{"text":"from cache","finish_reason":"length"}]}`
	)
	hijackClose := func(w http.ResponseWriter) {
		c, _, _ := w.(http.Hijacker).Hijack()
		_ = c.Close()
	}
	for _, tc := range []struct {
		name     string
		body     string
		first    func(http.ResponseWriter)
		status   int
		contains string
		legs     []string
		served   float64
		declined float64
	}{
		{name: "not tried: no threshold", body: `{"model":"m","prompt":"hi","max_tokens":4}`,
			status: 200, contains: "after prefill", legs: []string{"prefill", "decode"}},
		{name: "JSON served", body: `{"model":"m","prompt":"hi","max_tokens":4,"cache_hit_threshold":0.8}`,
			first: jsonAnswer(200, servedJSON), status: 200, contains: "from cache", legs: []string{"first"}, served: 1},
		{name: "JSON error answer relayed as the engine's", body: `{"model":"m","prompt":"hi","max_tokens":4,"cache_hit_threshold":0.8}`,
			first: jsonAnswer(400, `{"error":"nope"}`), status: 400, contains: "nope", legs: []string{"first"}, served: 1},
		{name: "JSON declined: the split", body: `{"model":"m","prompt":"hi","max_tokens":4,"cache_hit_threshold":0.8}`,
			first: jsonAnswer(200, declinedJSON), status: 200, contains: "after prefill", legs: []string{"first", "prefill", "decode"}, declined: 1},
		{name: "SSE served", body: `{"model":"m","prompt":"hi","max_tokens":4,"stream":true,"cache_hit_threshold":0.8}`,
			first:  sseAnswer(`{"choices":[{"text":"from","finish_reason":null}]}`, `{"choices":[{"text":" cache","finish_reason":"length"}]}`, "[DONE]"),
			status: 200, contains: " cache", legs: []string{"first"}, served: 1},
		{name: "SSE declined: the split", body: `{"model":"m","prompt":"hi","max_tokens":4,"stream":true,"cache_hit_threshold":0.8}`,
			first:  sseAnswer(`{"choices":[{"text":"","finish_reason":"cache_threshold"}]}`, "[DONE]"),
			status: 200, contains: "after prefill", legs: []string{"first", "prefill", "decode"}, declined: 1},
		{name: "failed before output: answered", body: `{"model":"m","prompt":"hi","max_tokens":4,"cache_hit_threshold":0.8}`,
			first: hijackClose, status: 502, legs: []string{"first"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := &firstEngine{first: tc.first}
			es := httptest.NewServer(eng)
			defer es.Close()
			host, port, _ := net.SplitHostPort(es.Listener.Addr().String())
			cfg := core.DefaultConfig()
			cfg.ModelServerHost = host
			cfg.ModelServerPort, _ = strconv.Atoi(port)
			m := metrics.New(prometheus.NewRegistry(), 0)
			p, err := inference.New(cfg, sharedstorage.New(), m, prometheus.NewRegistry(), zerolog.Nop())
			require.NoError(t, err)
			p.UseGoDriver(Serve)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			srv := &fasthttp.Server{Handler: front.Handler(p, 0)}
			go func() { _ = srv.Serve(ln) }()
			defer func() { _ = srv.Shutdown() }()

			req, err := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/completions", strings.NewReader(tc.body))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(core.HeaderPrefiller, es.Listener.Addr().String())
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			assert.Equal(t, tc.status, resp.StatusCode, "%s", b)
			assert.Contains(t, string(b), tc.contains)
			assert.Equal(t, tc.legs, eng.seen())
			assert.Equal(t, tc.served, testutil.ToFloat64(m.DecodeFirst.WithLabelValues(split.DecodeFirstServed)), "served")
			assert.Equal(t, tc.declined, testutil.ToFloat64(m.DecodeFirst.WithLabelValues(split.DecodeFirstDeclined)), "declined")
			assert.Eventually(t, func() bool { return testutil.ToFloat64(m.Inflight.WithLabelValues(metrics.PhaseLocal)) == 0 },
				5*time.Second, 10*time.Millisecond, "every local leg let go")
		})
	}
}
