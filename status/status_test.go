package status_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/status"
)

// clock is a settable time source.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// circuits is a fake breaker: each prefiller's state and last probe.
type circuits map[string]circuitView

type circuitView struct {
	state  string
	probed time.Time
}

func (c circuits) CircuitState(p string) string        { return c[p].state }
func (c circuits) CircuitLastProbe(p string) time.Time { return c[p].probed }

func split(p string) core.RequestReport {
	return core.RequestReport{Mode: metrics.ModeDisaggregated, Prefiller: p, Status: 200,
		PrefillDuration: 40 * time.Millisecond, KVHandoffDuration: 5 * time.Millisecond, KVTransferred: true}
}

func fallback(p, reason string) core.RequestReport {
	return core.RequestReport{Mode: metrics.ModeFallback, Prefiller: p, Reason: reason, Status: 200,
		PrefillDuration: 2 * time.Second}
}

func local() core.RequestReport {
	return core.RequestReport{Mode: metrics.ModeLocal, Status: 200}
}

// declined named prefiller p but its prompt was short: served locally.
func declined(p string) core.RequestReport {
	return core.RequestReport{Mode: metrics.ModeLocal, Prefiller: p, NamedPrefiller: true, Declined: metrics.DeclineShortPrompt, Status: 200}
}

// rejected is a prefill 4xx passed on to the client.
func rejected(p string) core.RequestReport {
	return core.RequestReport{Mode: metrics.ModeDisaggregated, Prefiller: p, Status: 400, PrefillDuration: time.Millisecond}
}

// badHeader named a prefiller that could not be used (no label).
func badHeader() core.RequestReport {
	return core.RequestReport{Mode: metrics.ModeFallback, NamedPrefiller: true, Reason: "bad_header", Status: 200}
}

// eos: the prefill's first token ended generation; no decode ran.
func eos(p string) core.RequestReport {
	return core.RequestReport{Mode: metrics.ModeDisaggregated, Prefiller: p, Status: 200, PrefillDuration: time.Millisecond}
}

func TestVerdicts(t *testing.T) {
	tests := []struct {
		name     string
		reports  []core.RequestReport
		verdict  string
		contains string
	}{
		{"nothing", nil, status.VerdictIdle, "no inference requests"},
		{"local only", []core.RequestReport{local(), local()}, status.VerdictNotConfigured, "none named a prefiller"},
		{"all fell back", []core.RequestReport{fallback("p:1", "timeout"), fallback("p:1", "timeout"), fallback("p:1", "unreachable")},
			status.VerdictNotOperating, "3 fell back to local prefill (timeout: 2, unreachable: 1); no split since start"},
		{"a prefill 4xx is no split", []core.RequestReport{rejected("p:1")}, status.VerdictNotOperating, "1 answered 4xx"},
		{"a bad header value named a prefiller", []core.RequestReport{badHeader(), local()}, status.VerdictNotOperating, "1 requests named a prefiller"},
		{"first-token EOS moved no KV", []core.RequestReport{eos("p:1")}, status.VerdictNotOperating, "1 answered without a KV handoff"},
		{"mixed", []core.RequestReport{split("p:1"), fallback("p:2", "server_error")}, status.VerdictDegraded, "1 of 2 requests that named a prefiller in the last 5m0s were split"},
		{"a failure degrades", []core.RequestReport{split("p:1"), {Mode: metrics.ModeDisaggregated, Prefiller: "p:1", Status: 502}}, status.VerdictDegraded, "1 failed"},
		{"operating", []core.RequestReport{split("p:1"), split("p:1"), local()}, status.VerdictOperating, "2 of 2 requests that named a prefiller in the last 5m0s were split, KV moved for each (1 local)"},
		{"operating, one refused", []core.RequestReport{split("p:1"), rejected("p:1")}, status.VerdictOperating, "the others: 1 answered 4xx"},
		{"declines only: nothing to split", []core.RequestReport{declined("p:1"), declined("p:1"), local()}, status.VerdictIdle,
			"nothing to split in the last 5m0s: 2 requests named a prefiller and every one was declined (short_prompt: 2) and served locally (3 local)"},
		{"declines do not degrade", []core.RequestReport{split("p:1"), declined("p:1")}, status.VerdictOperating,
			"1 of 1 requests that named a prefiller in the last 5m0s were split, KV moved for each (1 local); 1 more named a prefiller but were declined (short_prompt: 1) and served locally"},
		{"declines beside a fallback", []core.RequestReport{split("p:1"), fallback("p:1", "timeout"), declined("p:1")}, status.VerdictDegraded,
			"the others: 1 fell back to local prefill (timeout: 1); 1 more named a prefiller but were declined"},
		{"declines beside no split", []core.RequestReport{fallback("p:1", "timeout"), declined("p:1")}, status.VerdictNotOperating,
			"1 requests named a prefiller and none had a decode on moved KV"},
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

func TestNotOperatingWhenIdleAfterFailures(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	tr := status.New(status.Options{Connector: "nixlv2", Window: time.Minute, Now: c.now})
	tr.ObserveRequest(fallback("p:1", "unreachable"))
	c.t = c.t.Add(time.Hour)
	s := tr.Snapshot()
	assert.Equal(t, status.VerdictNotOperating, s.Verdict)
	assert.Contains(t, s.Summary, "no request has ever been split")
	assert.Nil(t, s.LastSplit)
}

func TestPrefillersCircuitAndBound(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	probed := c.t.Add(-120 * time.Millisecond)
	tests := []struct {
		name      string
		cb        status.CircuitStates
		want      string
		lastProbe *time.Time
		text      string // the CIRCUIT column
	}{
		{"no breaker", nil, status.CircuitNA, nil, "n/a"},
		{"breaker", circuits{"p:1": {state: "open"}}, "open", nil, "open"},
		{"probed", circuits{"p:1": {state: "open (probing)", probed: probed}}, "open (probing)", &probed,
			"open (probing), probed 120ms ago"},
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
			assert.Equal(t, tc.lastProbe, pf.CircuitLastProbe)
			var out bytes.Buffer
			require.NoError(t, s.WriteText(&out))
			assert.Regexp(t, `(?m)^p:1 +`+regexp.QuoteMeta(tc.text)+`  `, out.String())
			// The JSON snapshot carries the probe time as the text does.
			b, err := json.Marshal(s)
			require.NoError(t, err)
			var back status.Snapshot
			require.NoError(t, json.Unmarshal(b, &back))
			if tc.lastProbe == nil {
				assert.Nil(t, back.Prefillers[0].CircuitLastProbe)
			} else {
				require.NotNil(t, back.Prefillers[0].CircuitLastProbe)
				assert.True(t, tc.lastProbe.Equal(*back.Prefillers[0].CircuitLastProbe))
			}
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

// TestCountsAddUp: whatever mix of requests ends, the outcomes of those
// that named a prefiller sum to the named count, the modes sum to the
// requests, KV moved exactly for the splits, the per-prefiller splits add
// up to the window's, and the verdict agrees with the counts.
func TestCountsAddUp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	modes := []string{metrics.ModeDisaggregated, metrics.ModeLocal, metrics.ModeFallback}
	statuses := []int{200, 200, 200, 400, 403, 429, 499, 500, 502, 503}
	for round := range 300 {
		c := &clock{t: time.Unix(1_000_000, 0)}
		tr := status.New(status.Options{Connector: "nixlv2", Now: c.now})
		n := rng.IntN(40)
		for range n {
			r := core.RequestReport{Mode: modes[rng.IntN(3)], Status: statuses[rng.IntN(len(statuses))]}
			switch rng.IntN(4) {
			case 0: // no prefiller
			case 1:
				r.NamedPrefiller = true // a value naming no usable prefiller
			default:
				r.NamedPrefiller, r.Prefiller = true, []string{"p:1", "p:2", "p:3"}[rng.IntN(3)]
			}
			if r.Mode == metrics.ModeLocal && r.Prefiller != "" && rng.IntN(2) == 0 {
				r.Mode = metrics.ModeDisaggregated
			}
			if r.Mode == metrics.ModeDisaggregated && r.Prefiller == "" {
				r.Mode = metrics.ModeLocal // no prefiller to split with (the proxy reports it so)
			}
			if r.Prefiller != "" && rng.IntN(5) == 0 {
				r = declined(r.Prefiller) // served locally by choice
				r.Status = statuses[rng.IntN(len(statuses))]
			}
			r.KVTransferred = r.Mode == metrics.ModeDisaggregated && r.Status < 400 && rng.IntN(4) > 0
			if r.Mode == metrics.ModeFallback {
				r.Reason = []string{"timeout", "unreachable"}[rng.IntN(2)]
			}
			tr.ObserveRequest(r)
			c.t = c.t.Add(time.Duration(rng.IntN(3)) * time.Second)
		}
		s := tr.Snapshot()
		w := s.Window
		require.Equal(t, n, w.Disaggregated+w.Local+w.Fallback, "round %d: modes", round)
		require.Equal(t, w.NamedPrefiller, w.Split+w.NoHandoff+w.FellBack+w.Refused+w.NamedFailed, "round %d: outcomes %+v", round, w)
		require.Equal(t, w.Split, w.KVTransferred, "round %d", round)
		declines := 0
		for _, v := range w.DeclinedByReason {
			declines += v
		}
		require.Equal(t, w.Declined, declines, "round %d: declines by reason", round)
		rows := 0
		for _, p := range s.Prefillers {
			rows += p.Splits
		}
		require.Equal(t, w.Split, rows, "round %d: per-prefiller splits", round)
		switch s.Verdict {
		case status.VerdictOperating:
			require.True(t, w.Split > 0 && w.FellBack+w.NamedFailed == 0, "round %d: %+v", round, w)
		case status.VerdictDegraded:
			require.True(t, w.Split > 0 && w.FellBack+w.NamedFailed > 0, "round %d: %+v", round, w)
		case status.VerdictNotOperating:
			require.Zero(t, w.Split, "round %d", round)
		case status.VerdictNotConfigured:
			require.True(t, n > 0 && w.NamedPrefiller == 0, "round %d", round)
		case status.VerdictIdle:
			require.True(t, n == 0 || w.NamedPrefiller == 0 && w.Declined > 0, "round %d: %+v", round, w)
		default:
			t.Fatalf("round %d: verdict %q", round, s.Verdict)
		}
	}
}

// Chunked decodes are counted in the window and shown in the text view;
// the line is left out while there are none.
func TestChunkedDecodesCounted(t *testing.T) {
	tr := status.New(status.Options{Connector: "nixlv2", Transport: "engine-pull"})
	var out bytes.Buffer
	require.NoError(t, tr.Snapshot().WriteText(&out))
	assert.NotContains(t, out.String(), "chunked decodes")
	r := local()
	r.DecodeChunks = 3
	tr.ObserveRequest(r)
	s := split("10.0.0.9:8000")
	s.DecodeChunks = 2
	tr.ObserveRequest(s)
	tr.ObserveRequest(local())
	snap := tr.Snapshot()
	assert.Equal(t, 2, snap.Window.ChunkedDecodes)
	assert.Equal(t, 5, snap.Window.DecodeChunks)
	out.Reset()
	require.NoError(t, snap.WriteText(&out))
	assert.Regexp(t, `chunked decodes:\s+2 \(5 chunks\)`, out.String())
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

// TestDeclinedApartFromFallbacks: a split declined for a short prompt is
// counted in its own line of the window, in local, and neither among the
// requests that named a prefiller nor as a fallback; the per-prefiller
// table does not count it; the JSON snapshot carries the same counts.
func TestDeclinedApartFromFallbacks(t *testing.T) {
	tr := status.New(status.Options{Connector: "nixlv2", Transport: "engine-pull"})
	var out bytes.Buffer
	require.NoError(t, tr.Snapshot().WriteText(&out))
	assert.NotContains(t, out.String(), "declined", "no line while there are none")
	tr.ObserveRequest(split("10.0.0.9:8000"))
	tr.ObserveRequest(declined("10.0.0.9:8000"))
	tr.ObserveRequest(declined("10.0.0.9:8000"))
	s := tr.Snapshot()
	w := s.Window
	assert.Equal(t, 2, w.Declined)
	assert.Equal(t, map[string]int{metrics.DeclineShortPrompt: 2}, w.DeclinedByReason)
	assert.Equal(t, 2, w.Local)
	assert.Equal(t, 0, w.Fallback)
	assert.Equal(t, 1, w.NamedPrefiller)
	assert.Equal(t, 0, w.FellBack)
	assert.Empty(t, w.FallbacksByReason)
	assert.Equal(t, status.VerdictOperating, s.Verdict, s.Summary)
	require.Len(t, s.Prefillers, 1)
	assert.Equal(t, 1, s.Prefillers[0].Splits)
	assert.Equal(t, 0, s.Prefillers[0].Fallbacks)

	out.Reset()
	require.NoError(t, s.WriteText(&out))
	assert.Regexp(t, `\n  declined \(short prompt\):\s+2\n`, out.String())
	assert.Regexp(t, `\n    fell back:\s+0\n`, out.String())
	assert.Regexp(t, `\n  named a prefiller:\s+1\n`, out.String())
	assert.NotContains(t, out.String(), "DEGRADED")

	b, err := json.Marshal(s)
	require.NoError(t, err)
	var back status.Snapshot
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, s.Window, back.Window)
	assert.Contains(t, string(b), `"declined":2,"declined_by_reason":{"short_prompt":2}`)
}

// TestHistoriesCounted: multi-turn KV reuse's outcome of each turn's
// prefill is counted in the window and shown in the text.
func TestHistoriesCounted(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	tr := status.New(status.Options{Now: c.now})
	for _, h := range []string{"used", "used", "prefix_mismatch", ""} {
		r := split("10.0.0.1:8000")
		r.NamedPrefiller, r.History = true, h
		tr.ObserveRequest(r)
	}
	s := tr.Snapshot()
	assert.Equal(t, map[string]int{"used": 2, "prefix_mismatch": 1}, s.Window.Histories)
	var b bytes.Buffer
	require.NoError(t, s.WriteText(&b))
	assert.Regexp(t, `multi-turn histories:\s+used: 2, prefix_mismatch: 1`, b.String())
}
