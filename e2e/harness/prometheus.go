package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Prometheus is a real Prometheus server (Debian's prometheus package)
// that a test started on loopback, with a configuration and data directory
// of its own.
type Prometheus struct {
	*Proc
	Port int
}

// URL returns the server's base URL.
func (p *Prometheus) URL() string { return URL(p.Port) }

// PrometheusBinary returns the path of the prometheus binary on PATH. When
// there is none the test is skipped with a loud note, or fails when
// PROMETHEUS_REQUIRED is set (as .ci/run sets it, having installed the
// package). `make test` installs it with apt-get when it may.
func PrometheusBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err == nil {
		return bin
	}
	msg := "SKIPPED: prometheus is not installed (Debian's prometheus package: sudo apt-get install -y prometheus); " +
		"the alert rules and the dashboard's queries are not checked against a real Prometheus in this run"
	if os.Getenv("PROMETHEUS_REQUIRED") != "" {
		t.Fatalf("harness: PROMETHEUS_REQUIRED is set and %s", strings.TrimPrefix(msg, "SKIPPED: "))
	}
	t.Skip(msg)
	return ""
}

// StartPrometheus starts prometheus on a free loopback port with config
// (prometheus.yml) and files (written next to it, by name: rule files) in a
// temporary directory, its TSDB in another, and waits until it is ready.
func StartPrometheus(t testing.TB, config string, files map[string]string) *Prometheus {
	t.Helper()
	bin := PrometheusBinary(t)
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatalf("harness: %v", err)
		}
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatalf("harness: %v", err)
	}
	p := &Prometheus{}
	p.Proc = startOnFreePorts(t, true, func() (*Proc, string) {
		p.Port = FreePort(t)
		return Start(t, bin,
			"--config.file="+cfg,
			"--storage.tsdb.path="+t.TempDir(),
			"--web.listen-address="+HostPort(p.Port),
			"--log.level=warn",
		), p.URL() + "/-/ready"
	})
	return p
}

// Sample is one series of an instant vector.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Query evaluates expr now and returns its instant vector (a scalar is one
// sample without labels).
func (p *Prometheus) Query(t testing.TB, expr string) []Sample {
	t.Helper()
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	p.get(t, "/api/v1/query?query="+url.QueryEscape(expr), &data)
	switch data.ResultType {
	case "vector":
		var vec []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(data.Result, &vec); err != nil {
			t.Fatalf("harness: prometheus query %q: %v", expr, err)
		}
		out := make([]Sample, 0, len(vec))
		for _, s := range vec {
			out = append(out, Sample{Labels: s.Metric, Value: sampleValue(t, s.Value[1])})
		}
		return out
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(data.Result, &v); err != nil {
			t.Fatalf("harness: prometheus query %q: %v", expr, err)
		}
		return []Sample{{Labels: map[string]string{}, Value: sampleValue(t, v[1])}}
	}
	t.Fatalf("harness: prometheus query %q: a %s, not an instant vector", expr, data.ResultType)
	return nil
}

func sampleValue(t testing.TB, v any) float64 {
	t.Helper()
	s, _ := v.(string)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("harness: prometheus sample value %v: %v", v, err)
	}
	return f
}

// Alert is one alert of GET /api/v1/alerts.
type Alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"` // pending or firing
}

// Alerts returns the alerts pending or firing now.
func (p *Prometheus) Alerts(t testing.TB) []Alert {
	t.Helper()
	var data struct {
		Alerts []Alert `json:"alerts"`
	}
	p.get(t, "/api/v1/alerts", &data)
	return data.Alerts
}

// Targets returns the health ("up", "down", "unknown") of every active
// scrape target, by its scrape URL.
func (p *Prometheus) Targets(t testing.TB) map[string]string {
	t.Helper()
	var data struct {
		ActiveTargets []struct {
			ScrapeURL string `json:"scrapeUrl"`
			Health    string `json:"health"`
		} `json:"activeTargets"`
	}
	p.get(t, "/api/v1/targets?state=active", &data)
	out := map[string]string{}
	for _, tg := range data.ActiveTargets {
		out[tg.ScrapeURL] = tg.Health
	}
	return out
}

// get reads one answer of Prometheus' HTTP API into data.
func (p *Prometheus) get(t testing.TB, path string, data any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL()+path, nil)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("harness: prometheus %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		t.Fatalf("harness: prometheus %s: %v", path, err)
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatalf("harness: prometheus %s: %d %v: %.300s", path, resp.StatusCode, err, b)
	}
	if env.Status != "success" {
		t.Fatalf("harness: prometheus %s: %s", path, env.Error)
	}
	if err := json.Unmarshal(env.Data, data); err != nil {
		t.Fatalf("harness: prometheus %s: %v", path, err)
	}
}

// String is the sample as name{labels} value, for failure messages.
func (s Sample) String() string {
	return fmt.Sprintf("%v %g", s.Labels, s.Value)
}
