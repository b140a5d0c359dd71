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
