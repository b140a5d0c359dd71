package core

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/connectors/sglang"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/prewarm"
)

// prewarmProxy is a proxy with --prefill-prewarm on conn, port 8000 and
// POD_IP 10.0.0.5.
func prewarmProxy(t *testing.T, conn connectors.Connector, on bool) *Sidecar {
	t.Helper()
	cfg := DefaultConfig()
	cfg.PodIP = "10.0.0.5"
	cfg.DataParallelSize = 2
	cfg.PrefillPrewarm = on
	p, err := NewSidecar(cfg, conn, metrics.New(prometheus.NewRegistry(), 0), zerolog.Nop())
	require.NoError(t, err)
	return p
}

func prewarms(p *Sidecar, result string) float64 {
	return testutil.ToFloat64(p.M.Prewarms.WithLabelValues(result))
}

// TestPrewarmSightings: the proxy's warm-ups skip its own ports (each
// data-parallel rank's, on its pod IP, its host, or loopback) and stay off
// with a connector whose split cannot be warmed up.
func TestPrewarmSightings(t *testing.T) {
	type sight struct {
		hp    string
		fresh bool
		want  prewarm.Sighting
	}
	cases := []struct {
		name    string
		conn    connectors.Connector
		off     bool
		sights  []sight
		skipped float64
	}{
		{"new, then known", nixlv2.New(), false, []sight{
			{hp: "10.0.0.1:8000", want: prewarm.Queued},
			{hp: "10.0.0.1:8000", want: prewarm.Known},
			{hp: "10.0.0.2:8000", want: prewarm.Queued},
		}, 0},
		{"fresh warms a known one again", nixlv2.New(), false, []sight{
			{hp: "10.0.0.1:8000", want: prewarm.Queued},
			{hp: "10.0.0.1:8000", fresh: true, want: prewarm.Queued},
			{hp: "10.0.0.3:8000", fresh: true, want: prewarm.Queued},
		}, 0},
		{"own addresses skipped once", nixlv2.New(), false, []sight{
			{hp: "10.0.0.5:8000", want: prewarm.Skipped},
			{hp: "10.0.0.5:8000", want: prewarm.Known},
			{hp: "127.0.0.1:8001", want: prewarm.Skipped}, // rank 1
			{hp: "localhost:8000", want: prewarm.Skipped},
			{hp: "10.0.0.5:8002", want: prewarm.Queued}, // past the ranks
			{hp: "10.0.0.5:8200", want: prewarm.Queued},
		}, 3},
		{"off", nixlv2.New(), true, []sight{{hp: "10.0.0.1:8000", want: prewarm.Known}}, 0},
		{"connector not covered", sglang.New(8998), false, []sight{{hp: "10.0.0.1:8000", want: prewarm.Known}}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := prewarmProxy(t, c.conn, !c.off)
			for i, s := range c.sights {
				assert.Equal(t, s.want, p.warm.Saw(s.hp, s.fresh), "sighting %d: %s", i, s.hp)
			}
			assert.Equal(t, c.skipped, prewarms(p, metrics.PrewarmSkipped))
		})
	}
}
