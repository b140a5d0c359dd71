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
	require.NoError(t, err, "the pedantic registry accepts every collector")
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
	}
	for _, want := range []string{
		"pd_sidecar_requests_total", "pd_sidecar_fallbacks_total",
		"pd_sidecar_prefill_duration_seconds", "pd_sidecar_kv_transfer_duration_seconds",
		"pd_sidecar_ttft_seconds", "pd_sidecar_kv_load_failures_total",
		"pd_sidecar_inflight_requests", "pd_sidecar_prefill_retries_total",
		"pd_sidecar_client_disconnects_total", "pd_sidecar_split_declined_total",
		"pd_sidecar_upstream_refused_total",
	} {
		assert.True(t, names[want], "%s is exported", want)
	}
	// A second registry gets its own collectors: nothing is global.
	metrics.New(prometheus.NewRegistry(), 0)
}
