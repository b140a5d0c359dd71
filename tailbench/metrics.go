package tailbench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metricSet is one scrape of a /metrics endpoint.
type metricSet map[string]*dto.MetricFamily

// scrape reads url's Prometheus text exposition.
func scrape(ctx context.Context, url string) (metricSet, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: status %d", url, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bufio.NewReader(resp.Body))
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return fams, nil
}

// value sums the series of name whose labels include every name=value pair
// of kv (counters and gauges; a histogram's sample count). An absent metric
// reads 0: counters that never moved are often not exported.
func (m metricSet) value(name string, kv ...string) float64 {
	fam, ok := m[name]
	if !ok {
		return 0
	}
	var sum float64
	for _, s := range fam.GetMetric() {
		if !hasLabels(s.GetLabel(), kv) {
			continue
		}
		switch {
		case s.Counter != nil:
			sum += s.GetCounter().GetValue()
		case s.Gauge != nil:
			sum += s.GetGauge().GetValue()
		case s.Untyped != nil:
			sum += s.GetUntyped().GetValue()
		case s.Histogram != nil:
			sum += float64(s.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

func hasLabels(ls []*dto.LabelPair, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, l := range ls {
			if l.GetName() == kv[i] && l.GetValue() == kv[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// metricValue scrapes url once and returns one value (see value).
func metricValue(ctx context.Context, url, name string, kv ...string) (float64, error) {
	m, err := scrape(ctx, url)
	if err != nil {
		return 0, err
	}
	return m.value(name, kv...), nil
}
