package benchsuite

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// TestSummarizeRamp: streams with a first event count in the TTFT
// percentiles, cut short or not; a stream with an error counts once, as an
// error of its kind.
func TestSummarizeRamp(t *testing.T) {
	var streams []rampStream
	for i := 1; i <= 100; i++ {
		streams = append(streams, rampStream{first: true, ttft: time.Duration(i) * time.Millisecond, done: true})
	}
	streams[99].done = false // cut short at 100 ms
	streams[98] = rampStream{first: true, ttft: 99 * time.Millisecond, err: "error event"}
	streams = append(streams, rampStream{err: "connect"}, rampStream{err: "connect"}, rampStream{err: "status 503"})
	r := summarizeRamp("sidecar", streams)
	assert.Equal(t, rampTarget{Name: "sidecar", Streams: 103, OK: 98, Errors: 4, CutShort: 1,
		ErrorKinds: map[string]int{"connect": 2, "status 503": 1, "error event": 1},
		TTFT:       loadgen.Percentiles{P50: 50, P90: 90, P99: 99, Max: 100}}, r)

	none := summarizeRamp("nginx", []rampStream{{err: "connect"}})
	assert.Equal(t, loadgen.Percentiles{}, none.TTFT)
	assert.Equal(t, 1, none.Errors)
}

// TestRampBudgetLines: the sidecar's p99 against nginx's, the previous
// build's beside it, no line without both.
func TestRampBudgetLines(t *testing.T) {
	tgt := func(name string, p99 float64) rampTarget {
		return rampTarget{Name: name, TTFT: loadgen.Percentiles{P99: p99}}
	}
	r := &rampReport{Streams: 2000, Targets: []rampTarget{tgt("direct", 20), tgt("sidecar", 30), tgt("nginx", 40), tgt("previous", 35)}}
	lines := rampBudgetLines(r)
	require.Len(t, lines, 1)
	assert.Equal(t, budgetLine{"TTFT p99 while 2000 streams open (released at once) ≤ nginx's: sidecar 30.0 ms, nginx 40.0 ms (0.75×); previous build 35.0 ms", true}, lines[0])

	r.Targets[1].TTFT.P99, r.Targets[1].CutShort = 50, 2
	lines = rampBudgetLines(r)
	require.Len(t, lines, 1)
	assert.False(t, lines[0].met)
	assert.Equal(t, "TTFT p99 while 2000 streams open (released at once) ≤ nginx's: sidecar 50.0 ms, nginx 40.0 ms (1.25×); previous build 35.0 ms (sidecar: 0 errors, 2 cut short)", lines[0].line)

	assert.Empty(t, rampBudgetLines(&rampReport{Streams: 10, Targets: []rampTarget{tgt("direct", 1), tgt("sidecar", 2)}}))
	assert.Empty(t, rampBudgetLines(nil))
}

// TestWriteRampTable: a row per target, error kinds below.
func TestWriteRampTable(t *testing.T) {
	var b strings.Builder
	r := &rampReport{Streams: 3, Targets: []rampTarget{
		{Name: "direct", Streams: 3, OK: 3, TTFT: loadgen.Percentiles{P50: 1.25, P90: 2, P99: 3, Max: 4}},
		{Name: "sidecar", Streams: 3, OK: 1, Errors: 2, ErrorKinds: map[string]int{"status 503": 1, "connect": 1}},
	}}
	require.NoError(t, writeRampTable(&b, r))
	out := b.String()
	assert.Contains(t, out, "ramp: 3 chat streams released at once")
	assert.Regexp(t, `direct +3 +3 +0 +0 +1\.2 +2\.0 +3\.0 +4\.0`, out)
	assert.Contains(t, out, "sidecar errors: connect: 1, status 503: 1\n")
}

// TestRampOnce: every stream on a connection of its own, read to its end
// through chunked encoding: a stream ending with [DONE] is ok, one ending
// without it cut short, one refused an error; TTFT counts to the first
// data: event.
func TestRampOnce(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		fmt.Fprint(w, ": comment\n\n")
		f.Flush()
		time.Sleep(20 * time.Millisecond)
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			f.Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	body := []byte(`{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	streams := rampOnce(ctx, addr, body, 50, 0)
	r := summarizeRamp("t", streams)
	assert.Equal(t, 50, r.OK, "%+v", r)
	assert.GreaterOrEqual(t, r.TTFT.P50, 20.0)

	// Paced arrivals: 10 streams at 100 a second take at least 90 ms.
	began := time.Now()
	r = summarizeRamp("t", rampOnce(ctx, addr, body, 10, 100))
	assert.Equal(t, 10, r.OK, "%+v", r)
	assert.GreaterOrEqual(t, time.Since(began), 90*time.Millisecond)

	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "data: {\"n\":0}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection ends mid-stream
	}))
	defer cut.Close()
	r = summarizeRamp("t", rampOnce(ctx, strings.TrimPrefix(cut.URL, "http://"), body, 5, 0))
	assert.Equal(t, rampTarget{Name: "t", Streams: 5, CutShort: 5, TTFT: r.TTFT}, r)

	refused := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer refused.Close()
	r = summarizeRamp("t", rampOnce(ctx, strings.TrimPrefix(refused.URL, "http://"), body, 5, 0))
	assert.Equal(t, map[string]int{"status 503": 5}, r.ErrorKinds)
}
