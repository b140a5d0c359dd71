package metrics_test

import (
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

func TestBounded(t *testing.T) {
	b := metrics.NewBounded(2)
	assert.Equal(t, "a", b.Label("a"))
	assert.Equal(t, "b", b.Label("b"))
	assert.Equal(t, metrics.Other, b.Label("c"))
	assert.Equal(t, "a", b.Label("a"))
	for i := range 100 {
		assert.Equal(t, metrics.Other, b.Label(strconv.Itoa(i)))
	}
}

func TestNewRegistersEverything(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg, 0)
	m.Requests.WithLabelValues(metrics.ModeLocal, "200").Inc()
	m.Fallbacks.WithLabelValues("timeout").Inc()
	m.PrefillDuration.WithLabelValues("p").Observe(1)
	m.KVTransferDuration.WithLabelValues("p").Observe(1)
	m.TTFT.WithLabelValues(metrics.ModeLocal).Observe(1)
	m.KVLoadFailures.WithLabelValues("p").Inc()
	m.PrefillRetries.WithLabelValues("p").Inc()
	m.ClientDisconnects.WithLabelValues(metrics.PhaseDecode).Inc()
	fams, err := reg.Gather()
	require.NoError(t, err)
	n := 0
	for _, f := range fams {
		n += len(f.GetMetric())
	}
	assert.Equal(t, 12, n)
	// A second registry gets its own collectors: nothing is global.
	metrics.New(prometheus.NewRegistry(), 0)
}
