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

// queries walks a Grafana dashboard and returns every PromQL expression of
// its panels (rows' nested panels included) and templating variables.
func queries(t *testing.T, dash map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(panels []any)
	walk = func(panels []any) {
		for _, p := range panels {
			pm := p.(map[string]any)
			title, _ := pm["title"].(string)
			if nested, ok := pm["panels"].([]any); ok {
				walk(nested)
			}
			targets, _ := pm["targets"].([]any)
			if pm["type"] != "row" {
				require.NotEmpty(t, targets, "panel %q has no query", title)
			}
			for _, tg := range targets {
				expr, _ := tg.(map[string]any)["expr"].(string)
				require.NotEmpty(t, expr, "panel %q has a target without expr", title)
				out["panel "+title+": "+tg.(map[string]any)["refId"].(string)] = expr
			}
		}
	}
	walk(dash["panels"].([]any))
	tmpl, _ := dash["templating"].(map[string]any)
	list, _ := tmpl["list"].([]any)
	for _, v := range list {
		vm := v.(map[string]any)
		if vm["type"] != "query" {
			continue
		}
		q := vm["query"]
		if qm, ok := q.(map[string]any); ok {
			q = qm["query"]
		}
		out["variable "+vm["name"].(string)] = q.(string)
	}
	return out
}

func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	b, err := os.ReadFile("../grafana/pd-sidecar.json")
	require.NoError(t, err)
	var dash map[string]any
	require.NoError(t, json.Unmarshal(b, &dash), "the dashboard is valid JSON")
	require.NotEmpty(t, dash["title"])
	require.NotEmpty(t, dash["uid"])
	names := exported(t)
	for _, r := range recorded(t) {
		names[r] = true
	}
	qs := queries(t, dash)
	require.GreaterOrEqual(t, len(qs), 10)
	covered := map[string]bool{}
	for where, expr := range qs {
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
