package benchsuite

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// TestLongWorkloadLengths: every body of a length carries a prompt of
// exactly that many words (engine-sim tokens), and the bodies are the
// sizes the report's per-MB figures assume (~7 bytes a word).
func TestLongWorkloadLengths(t *testing.T) {
	for _, words := range []int{1000, 30000} {
		reqs := longWorkload(words, 3).Generate()
		require.Len(t, reqs, 3)
		for _, r := range reqs {
			content := gjson.GetBytes(r.Body, "messages.0.content").String()
			assert.Len(t, strings.Fields(content), words)
			assert.True(t, gjson.GetBytes(r.Body, "stream").Bool())
			assert.Equal(t, 16, r.MaxTokens)
		}
		kb := meanBodyKB(reqs)
		assert.InDelta(t, float64(words)*7.4/1e3, kb, float64(words)*1.5/1e3, "%d words: %.0f KB", words, kb)
	}
	assert.NotEqual(t, longWorkload(1000, 2).Generate()[0].Body, longWorkload(1000, 2).Generate()[1].Body)
}

// TestPerBody: CPU per request in µs and per MB (10^6 bytes) of body in ms.
func TestPerBody(t *testing.T) {
	us, ms := perBody(300*time.Millisecond, 100, 20_000_000)
	assert.InDelta(t, 3000, us, 1e-9)
	assert.InDelta(t, 15, ms, 1e-9)
	us, ms = perBody(time.Second, 0, 0)
	assert.Zero(t, us)
	assert.Zero(t, ms)
}

// TestLongBudgetLines: the budget is stated for the 30,000-word run only,
// each line with its ratio and verdict, for the sidecars with every
// processor and, where they ran, with one.
func TestLongBudgetLines(t *testing.T) {
	summary := func(name string, p50 float64) loadgen.Summary {
		return loadgen.Summary{Name: name, TTFT: loadgen.Percentiles{P50: p50}}
	}
	run := longRun{Words: budgetWords,
		Report: loadgen.Report{Targets: []loadgen.Summary{summary("direct", 1.0), summary("sidecar", 1.5), summary("nginx", 1.2),
			summary("sidecar-1p", 1.25)}},
		Costs: []longCost{{Proxy: "sidecar", CPUMicros: 500}, {Proxy: "nginx", CPUMicros: 430},
			{Proxy: "sidecar-pd", CPUMicros: 1200}, {Proxy: "peer-pd", CPUMicros: 8100},
			{Proxy: "sidecar-1p", CPUMicros: 600}, {Proxy: "sidecar-pd-1p", CPUMicros: 1000}}}
	lines := longBudgetLines([]longRun{{Words: 1000}, run})
	require.Len(t, lines, 7)
	assert.True(t, lines[0].met, lines[0].line) // 1.16× nginx
	assert.Contains(t, lines[0].line, "1.16×")
	assert.False(t, lines[1].met, lines[1].line) // +0.5 ms against +0.2 + 0.1
	assert.False(t, lines[2].met, lines[2].line) // 2.79× nginx
	assert.False(t, lines[3].met, lines[3].line) // one processor: 1.40× nginx
	assert.Contains(t, lines[3].line, "GOMAXPROCS=1")
	assert.True(t, lines[4].met, lines[4].line) // +0.25 ms against +0.2 + 0.1
	assert.True(t, lines[5].met, lines[5].line) // 2.33× nginx
	assert.True(t, lines[6].met, lines[6].line) // 6.75× the peer
	assert.Contains(t, lines[6].line, "peer")
	assert.Empty(t, longBudgetLines([]longRun{{Words: 1000}}))
}

// TestLongOptionsValidate: a scenario with lengths needs a rate, a
// duration and rounds; one without lengths is off and always valid.
func TestLongOptionsValidate(t *testing.T) {
	assert.NoError(t, LongOptions{}.Validate())
	ok := LongOptions{Words: []int{1000}, Rate: 10, Duration: time.Second, Rounds: 1}
	assert.NoError(t, ok.Validate())
	bad := ok
	bad.Rate = 0
	assert.Error(t, bad.Validate())
	bad = ok
	bad.Words = []int{0}
	assert.Error(t, bad.Validate())
	bad = ok
	bad.Rounds = 0
	assert.Error(t, bad.Validate())
}

// TestTreeUsageBusy: this process's busy time (exact, from schedstat
// where the kernel keeps it) grows as it burns CPU, and agrees with the
// clock-tick count of utime+stime.
func TestTreeUsageBusy(t *testing.T) {
	u0, err := treeUsage(os.Getpid())
	require.NoError(t, err)
	var u1 procUsage
	deadline := time.Now().Add(20 * time.Second)
	for x := 0; time.Now().Before(deadline); {
		for range 1 << 20 {
			x++
		}
		if u1, err = treeUsage(os.Getpid()); err == nil && u1.CPU-u0.CPU >= 300*time.Millisecond {
			break
		}
	}
	require.GreaterOrEqual(t, u1.CPU-u0.CPU, 300*time.Millisecond, "burnt CPU, by clock ticks")
	busy := u1.busy() - u0.busy()
	assert.InDelta(t, float64(u1.CPU-u0.CPU), float64(busy), float64(150*time.Millisecond),
		"busy %v against %v by clock ticks (schedstat read: %v)", busy, u1.CPU-u0.CPU, u1.onCPUOK)
}
