package rendertest_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/pd-sidecar/pd-sidecar/deploy/grafana"
	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// recorder is a Registerer that remembers what metrics.New registers,
// including vectors that have no series yet (a Gather would miss them).
type recorder struct {
	prometheus.Registerer
	names map[string]bool // metric names, histograms with their series suffixes
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			continue
		}
		r.names[m[1]] = true
		switch c.(type) {
		case *prometheus.HistogramVec, prometheus.Histogram:
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				r.names[m[1]+s] = true
			}
		}
	}
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// exported returns every series name the sidecar exports (metrics.New, and
// the KV-pull collectors of --kv-connector sidecar).
func exported(t *testing.T) map[string]bool {
	t.Helper()
	r := &recorder{Registerer: prometheus.NewRegistry(), names: map[string]bool{}}
	metrics.New(r, 8)
	metrics.NewKVPull(r) // registered by the sidecar with --kv-connector sidecar
	require.NotEmpty(t, r.names)
	return r.names
}

func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	var dash map[string]any
	require.NoError(t, json.Unmarshal(grafana.JSON, &dash), "the dashboard is valid JSON")
	require.NotEmpty(t, dash["title"])
	require.NotEmpty(t, dash["uid"])
	names := exported(t)
	for _, r := range recorded(t) {
		names[r] = true
	}
	qs, err := grafana.Queries(grafana.JSON)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(qs), 10)
	covered := map[string]bool{}
	for _, q := range qs {
		where, expr := q.Where, q.Expr
		ms := rendertest.MetricNames(expr)
		assert.NotEmpty(t, ms, "%s names no metric: %s", where, expr)
		for _, m := range ms {
			assert.True(t, names[m], "%s queries %q, which the sidecar does not export: %s", where, m, expr)
			covered[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")] = true
		}
	}
	// The panels every operator looks at first: split ratio, fallbacks by
	// reason, the ratios per pool and per prefiller, prefill and KV latency
	// per prefiller, TTFT by mode, in-flight.
	for _, m := range []string{"pool:pd_sidecar_split_ratio:rate5m", "pool:pd_sidecar_fallback_ratio:rate5m",
		"prefiller:pd_sidecar_split_ratio:rate5m", "prefiller:pd_sidecar_fallback_ratio:rate5m", "pd_sidecar_requests_total", "pd_sidecar_fallbacks_total", "pd_sidecar_prefill_duration_seconds",
		"pd_sidecar_kv_transfer_duration_seconds", "pd_sidecar_ttft_seconds", "pd_sidecar_inflight_requests"} {
		assert.True(t, covered[m], "no panel shows %s", m)
	}
}

// recorded returns the names the recording rules of
// deploy/prometheus/pd-sidecar-rules.yaml record.
func recorded(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../prometheus/pd-sidecar-rules.yaml")
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Rules []struct {
				Record string `json:"record"`
			} `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(b, &f))
	var out []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out = append(out, r.Record)
			}
		}
	}
	require.NotEmpty(t, out)
	return out
}

func TestMetricNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`sum by (mode) (rate(pd_sidecar_requests_total{mode="a,b", pod=~"$pod"}[$__rate_interval]))`, []string{"pd_sidecar_requests_total"}},
		{`histogram_quantile(0.99, sum by (le, prefiller) (rate(x_seconds_bucket{a="b"}[5m]))) / on (pod) group_left (c) y`, []string{"x_seconds_bucket", "y"}},
		{`a / b offset 5m > bool 1e3 and c unless d`, []string{"a", "b", "c", "d"}},
		{`label_values(pd_sidecar_requests_total{namespace=~"$namespace"}, pod)`, []string{"pd_sidecar_requests_total"}},
		{`vllm:num_requests_running`, []string{"vllm:num_requests_running"}},
	}
	for _, tc := range tests {
		t.Run(tc.expr, func(t *testing.T) {
			assert.Equal(t, tc.want, rendertest.MetricNames(tc.expr))
		})
	}
}
