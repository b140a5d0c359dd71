package status_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy"
	"github.com/pd-sidecar/pd-sidecar/status"
)

// clock is a settable time source.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// circuits is a fake breaker.
type circuits map[string]string

func (c circuits) CircuitState(p string) string { return c[p] }

func split(p string) proxy.RequestReport {
	return proxy.RequestReport{Mode: metrics.ModeDisaggregated, Prefiller: p, Status: 200,
		PrefillDuration: 40 * time.Millisecond, KVHandoffDuration: 5 * time.Millisecond, KVTransferred: true}
}

func fallback(p, reason string) proxy.RequestReport {
	return proxy.RequestReport{Mode: metrics.ModeFallback, Prefiller: p, Reason: reason, Status: 200,
		PrefillDuration: 2 * time.Second}
}

func local() proxy.RequestReport { return proxy.RequestReport{Mode: metrics.ModeLocal, Status: 200} }

func TestVerdicts(t *testing.T) {
	tests := []struct {
		name     string
		reports  []proxy.RequestReport
		verdict  string
		contains string
	}{
		{"nothing", nil, status.VerdictIdle, "no inference requests"},
		{"local only", []proxy.RequestReport{local(), local()}, status.VerdictNotRequested, "none named a prefiller"},
		{"all fell back", []proxy.RequestReport{fallback("p:1", "timeout"), fallback("p:1", "timeout"), fallback("p:1", "unreachable")},
			status.VerdictNeverSplit, "all fell back to local prefill (timeout: 2, unreachable: 1); no split since start"},
		{"mixed", []proxy.RequestReport{split("p:1"), fallback("p:2", "server_error")}, status.VerdictDegraded, "1 of 2 requests that named a prefiller were split"},
		{"operating", []proxy.RequestReport{split("p:1"), split("p:1"), local()}, status.VerdictOperating, "2 of 3 requests"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{t: time.Unix(1_000_000, 0)}
			tr := status.New(status.Options{Connector: "nixlv2", Transport: "engine-pull", Now: c.now})
			for _, r := range tc.reports {
				tr.ObserveRequest(r)
			}
			s := tr.Snapshot()
			assert.Equal(t, tc.verdict, s.Verdict)
			assert.Contains(t, s.Summary, tc.contains)
		})
	}
}

func TestWindowExpiresAndLastTimesStay(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	tr := status.New(status.Options{Connector: "nixlv2", Window: time.Minute, Now: c.now})
	tr.ObserveRequest(split("p:1"))
	tr.ObserveRequest(fallback("p:1", "timeout"))
	c.t = c.t.Add(30 * time.Second)
	tr.ObserveRequest(split("p:1"))
	s := tr.Snapshot()
	require.Equal(t, 2, s.Window.Disaggregated)
	require.Equal(t, 1, s.Window.Fallback)
	require.Equal(t, map[string]int{"timeout": 1}, s.Window.FallbacksByReason)
	require.Equal(t, 2, s.Window.KVTransferred)

	c.t = c.t.Add(45 * time.Second) // the first bucket left the window
	s = tr.Snapshot()
	assert.Equal(t, 1, s.Window.Disaggregated)
	assert.Equal(t, 0, s.Window.Fallback)
	require.NotNil(t, s.LastSplit)
	assert.Equal(t, 45*time.Second, s.Now.Sub(*s.LastSplit))

	c.t = c.t.Add(10 * time.Minute) // everything left the window, the ring slots are reused
	s = tr.Snapshot()
	assert.Equal(t, 0, s.Window.Disaggregated+s.Window.Fallback)
	assert.Equal(t, status.VerdictIdle, s.Verdict)
	assert.Equal(t, 2, s.SinceStart[metrics.ModeDisaggregated])
	require.NotNil(t, s.LastKVTransfer)
}

func TestNeverSplitWhenIdleAfterFailures(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	tr := status.New(status.Options{Connector: "nixlv2", Window: time.Minute, Now: c.now})
	tr.ObserveRequest(fallback("p:1", "unreachable"))
	c.t = c.t.Add(time.Hour)
	s := tr.Snapshot()
	assert.Equal(t, status.VerdictNeverSplit, s.Verdict)
	assert.Contains(t, s.Summary, "no request has ever been split")
	assert.Nil(t, s.LastSplit)
}

func TestPrefillersCircuitAndBound(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	tests := []struct {
		name string
		cb   status.CircuitStates
		want string
	}{
		{"no breaker", nil, status.CircuitNA},
		{"breaker", circuits{"p:1": "open"}, "open"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := status.New(status.Options{MaxPrefillers: 2, Circuits: tc.cb, Now: c.now})
			tr.ObserveRequest(split("p:1"))
			tr.ObserveRequest(fallback("p:1", "timeout"))
			s := tr.Snapshot()
			require.Len(t, s.Prefillers, 1)
			pf := s.Prefillers[0]
			assert.Equal(t, tc.want, pf.Circuit)
			assert.Equal(t, 1, pf.Splits)
			assert.Equal(t, 1, pf.Fallbacks)
			assert.Equal(t, "timeout", pf.LastReason)
			assert.Equal(t, 2000.0, pf.PrefillMaxMs)
			assert.Equal(t, 5.0, pf.KVHandoffP50Ms)
		})
	}
	tr := status.New(status.Options{MaxPrefillers: 2, Now: c.now})
	for _, p := range []string{"a:1", "b:1", "c:1", "d:1"} {
		c.t = c.t.Add(time.Second)
		tr.ObserveRequest(split(p))
	}
	s := tr.Snapshot()
	require.Len(t, s.Prefillers, 2)
	assert.Equal(t, "d:1", s.Prefillers[0].Prefiller)
	assert.Equal(t, "c:1", s.Prefillers[1].Prefiller)
}

func TestServeFetchAndText(t *testing.T) {
	tr := status.New(status.Options{Connector: "nixlv2", Transport: "engine-pull"})
	tr.ObserveRequest(split("10.0.0.9:8000"))
	tr.ObserveRequest(fallback("10.0.0.9:8000", "timeout"))
	// ServeDebug through a real fasthttp handler.
	var rc fasthttp.RequestCtx
	rc.Request.Header.SetMethod(fasthttp.MethodGet)
	tr.ServeDebug(&rc)
	require.Equal(t, fasthttp.StatusOK, rc.Response.StatusCode())
	body := append([]byte(nil), rc.Response.Body()...)
	require.True(t, json.Valid(body))

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != status.Path {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	s, err := status.Fetch(context.Background(), srv.Client(), srv.URL+"/")
	require.NoError(t, err)
	assert.Equal(t, status.VerdictDegraded, s.Verdict)
	var out bytes.Buffer
	require.NoError(t, s.WriteText(&out))
	for _, want := range []string{"DEGRADED:", "connector:", "nixlv2", "10.0.0.9:8000", "n/a", "timeout: 1", "PREFILLER"} {
		assert.Contains(t, out.String(), want)
	}
	_, err = status.Fetch(context.Background(), srv.Client(), srv.URL+"/nope")
	require.Error(t, err)
}

// TestEncoderStages: the window counts requests through the encoder stage
// by outcome, shown in the text view; none, no line.
func TestEncoderStages(t *testing.T) {
	tr := status.New(status.Options{Connector: "nixlv2", Transport: "engine-pull"})
	var out bytes.Buffer
	require.NoError(t, tr.Snapshot().WriteText(&out))
	assert.NotContains(t, out.String(), "encoder stages")
	for _, o := range []string{metrics.StageEncoded, metrics.StageEncoded, metrics.StageDegraded} {
		r := local()
		r.Encoder = o
		tr.ObserveRequest(r)
	}
	tr.ObserveRequest(local())
	s := tr.Snapshot()
	assert.Equal(t, map[string]int{metrics.StageEncoded: 2, metrics.StageDegraded: 1}, s.Window.EncoderStages)
	out.Reset()
	require.NoError(t, s.WriteText(&out))
	assert.Contains(t, out.String(), "encoder stages:")
	assert.Contains(t, out.String(), "encoded: 2")
}
