// Package promscrape reads a Prometheus text exposition (a /metrics
// endpoint) and sums its series by label: what the e2e harness and the
// benchmarks assert on and report.
package promscrape

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

// Metrics is one scrape of a Prometheus endpoint, by metric name.
type Metrics map[string]*dto.MetricFamily

// scrapeTimeout bounds one scrape.
const scrapeTimeout = 5 * time.Second

// Scrape fetches and parses url (a /metrics endpoint), within ctx and
// at most 5 s.
func Scrape(ctx context.Context, url string) (Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
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
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	return fams, nil
}

// Value returns the sum over every series of metric name whose labels
// include all of labels (counter, gauge, untyped; the sample count for
// histograms). A metric that is absent reads as 0, as Prometheus counters
// that never moved are often not exported.
func (m Metrics) Value(name string, labels map[string]string) float64 {
	fam, ok := m[name]
	if !ok {
		return 0
	}
	var sum float64
	for _, s := range fam.GetMetric() {
		if !matches(s.GetLabel(), labels) {
			continue
		}
		switch {
		case s.Counter != nil:
			sum += s.GetCounter().GetValue()
		case s.Gauge != nil:
			sum += s.GetGauge().GetValue()
		case s.Histogram != nil:
			sum += float64(s.GetHistogram().GetSampleCount())
		case s.Untyped != nil:
			sum += s.GetUntyped().GetValue()
		}
	}
	return sum
}

func matches(have []*dto.LabelPair, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range have {
			if l.GetName() == k && l.GetValue() == v {
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
