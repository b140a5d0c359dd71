package tailbench

import (
	"context"

	"github.com/pd-sidecar/pd-sidecar/promscrape"
)

// metricSet is one scrape of a /metrics endpoint.
type metricSet struct{ promscrape.Metrics }

// scrape reads url's Prometheus text exposition.
func scrape(ctx context.Context, url string) (metricSet, error) {
	m, err := promscrape.Scrape(ctx, url)
	return metricSet{m}, err
}

// value sums the series of name whose labels include every name=value pair
// of kv (promscrape.Metrics.Value).
func (m metricSet) value(name string, kv ...string) float64 {
	labels := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		labels[kv[i]] = kv[i+1]
	}
	return m.Value(name, labels)
}

// metricValue scrapes url once and returns one value (see value).
func metricValue(ctx context.Context, url, name string, kv ...string) (float64, error) {
	m, err := scrape(ctx, url)
	if err != nil {
		return 0, err
	}
	return m.value(name, kv...), nil
}
