package benchsuite

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// TestPreviousBudgetLines: the sidecar against the previous build, path by
// path, a line only where both ran, ratios of this run's figures.
func TestPreviousBudgetLines(t *testing.T) {
	r := &report{
		Saturation: loadgen.Report{Targets: []loadgen.Summary{
			{Name: "sidecar", ReqPerSec: 1100}, {Name: "previous", ReqPerSec: 1000},
			{Name: "sidecar-pd", ReqPerSec: 450}, {Name: "previous-pd", ReqPerSec: 500},
		}},
		Costs: []proxyCost{
			{Proxy: "sidecar", CPUMicros: 50}, {Proxy: "previous", CPUMicros: 50},
			{Proxy: "sidecar-pd", CPUMicros: 120}, {Proxy: "previous-pd", CPUMicros: 100},
		},
	}
	lines := previousBudgetLines(r)
	require.Len(t, lines, 4)
	assert.Equal(t, budgetLine{"local saturation ≥ 1.0× the previous build: 1.10× (1100 vs 1000 req/s)", true}, lines[0])
	assert.Equal(t, budgetLine{"local CPU per request ≤ 1.0× the previous build: 1.00× (50.0 vs 50.0 µs)", true}, lines[1])
	assert.Equal(t, budgetLine{"P/D saturation ≥ 1.0× the previous build: 0.90× (450 vs 500 req/s)", false}, lines[2])
	assert.Equal(t, budgetLine{"P/D CPU per request ≤ 1.0× the previous build: 1.20× (120.0 vs 100.0 µs)", false}, lines[3])

	r.Saturation.Targets = r.Saturation.Targets[:2]
	r.Costs = r.Costs[:2]
	assert.Len(t, previousBudgetLines(r), 2)
	assert.Empty(t, previousBudgetLines(&report{}))
}

// TestHopBudgetLine: the split's TTFT over the floor against nginx's over
// direct plus 0.05 ms, p50 of the open-loop run, only with nginx and the
// floor.
func TestHopBudgetLine(t *testing.T) {
	summary := func(name string, p50 float64) loadgen.Summary {
		return loadgen.Summary{Name: name, TTFT: loadgen.Percentiles{P50: p50}}
	}
	open := loadgen.Report{Targets: []loadgen.Summary{summary("direct", 0.80), summary("nginx", 0.86),
		summary("floor", 1.60), summary("sidecar-pd", 1.70)}}
	b, ok := hopBudgetLine(open)
	require.True(t, ok)
	assert.True(t, b.met, b.line) // 0.10 ≤ 0.06 + 0.05
	assert.Equal(t, "disaggregated hop within 0.05 ms of the floor plus one nginx hop (p50): sidecar-pd +0.100 ms over the floor, nginx +0.060 ms over direct (+0.040 ms beyond it)", b.line)
	open.Targets[3] = summary("sidecar-pd", 1.72)
	b, _ = hopBudgetLine(open)
	assert.False(t, b.met, b.line) // 0.12 > 0.11
	_, ok = hopBudgetLine(loadgen.Report{Targets: []loadgen.Summary{summary("direct", 0.8), summary("floor", 1.6), summary("sidecar-pd", 1.7)}})
	assert.False(t, ok, "no nginx")
	_, ok = hopBudgetLine(loadgen.Report{Targets: []loadgen.Summary{summary("direct", 0.8), summary("nginx", 0.9), summary("sidecar-pd", 1.7)}})
	assert.False(t, ok, "no floor")
}
