package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// series maps "name{label="value",...}" to a value; histograms contribute
// their sample count.
type series map[string]float64

type snapshot struct {
	sidecar, prefill, decode series
}

func (d *demo) snapshot(ctx context.Context) (snapshot, error) {
	var s snapshot
	var err error
	if s.sidecar, err = scrape(ctx, d.sidecar+"/metrics"); err != nil {
		return s, err
	}
	if s.prefill, err = scrape(ctx, d.prefill+"/metrics"); err != nil {
		return s, err
	}
	s.decode, err = scrape(ctx, d.decode+"/metrics")
	return s, err
}

func scrape(ctx context.Context, url string) (series, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bufio.NewReader(resp.Body))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	out := series{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			out[key(name, m)] += value(m)
		}
	}
	return out, nil
}

func key(name string, m *dto.Metric) string {
	var labels []string
	for _, l := range m.GetLabel() {
		if l.GetName() == "model_name" || l.GetName() == "engine" {
			continue
		}
		labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	if len(labels) == 0 {
		return name
	}
	return name + "{" + strings.Join(labels, ",") + "}"
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return m.GetUntyped().GetValue()
}

// delta returns after-before for every series of name (any labels).
func delta(before, after series, name string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if k == name || strings.HasPrefix(k, name+"{") {
			if d := v - before[k]; d != 0 {
				out[k] = d
			}
		}
	}
	return out
}

func sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

func report(w io.Writer, classes []trafficClass, results []classResult, before, after snapshot) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "traffic class\tanswered\tfailed\tsame tokens as local\tp50 latency\tp99 latency")
	var disaggOK int
	for i, c := range classes {
		r := results[i]
		same := "(reference)"
		if c.header != "" {
			same = fmt.Sprintf("%d/%d", r.same, r.compared)
		}
		if c.header != "" && strings.HasPrefix(c.name, "disaggregated") {
			disaggOK += r.ok
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%v\t%v\n", c.name, r.ok, r.failed, same,
			percentile(r.latencies, 0.5).Round(time.Millisecond), percentile(r.latencies, 0.99).Round(time.Millisecond))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i, r := range results {
		for _, e := range r.errs {
			fmt.Fprintf(w, "  %s: %s\n", classes[i].name, e)
		}
	}

	fmt.Fprintln(w, "\nwhat really happened (metric deltas over the run)")
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	line := func(who, name string, d map[string]float64, meaning string) {
		if len(d) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t+0\t%s\n", who, name, meaning)
			return
		}
		keys := make([]string, 0, len(d))
		for k := range d {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(tw, "%s\t%s\t%+g\t%s\n", who, k, d[k], meaning)
			who, meaning = "", ""
		}
	}
	prefills := delta(before.prefill, after.prefill, "sim_remote_decode_prefills_total")
	pulled := delta(before.decode, after.decode, "sim_remote_kv_decodes_total")
	line("prefiller", "sim_remote_decode_prefills_total", prefills, "prefills done for the decoder")
	fmt.Fprintf(tw, "\tsim_kv_blocks_held\t%g\tKV blocks left held now (stranded if not 0)\n", after.prefill["sim_kv_blocks_held"])
	line("decoder", "sim_remote_kv_decodes_total", pulled, "decodes that used KV pulled from the prefiller")
	line("", "sim_local_prefill_tokens_total", delta(before.decode, after.decode, "sim_local_prefill_tokens_total"), "prompt tokens the decoder prefilled itself")
	line("", "vllm:nixl_bytes_transferred", delta(before.decode, after.decode, "vllm:nixl_bytes_transferred"), "KV transfers")
	line("sidecar", "pd_sidecar_requests_total", delta(before.sidecar, after.sidecar, "pd_sidecar_requests_total"), "")
	line("", "pd_sidecar_fallbacks_total", delta(before.sidecar, after.sidecar, "pd_sidecar_fallbacks_total"), "degraded to local prefill, by reason")
	line("", "pd_sidecar_kv_load_failures_total", delta(before.sidecar, after.sidecar, "pd_sidecar_kv_load_failures_total"), "")
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w)
	switch {
	case disaggOK > 0 && sum(pulled) >= float64(disaggOK) && sum(prefills) >= float64(disaggOK):
		fmt.Fprintf(w, "verdict: the split is operating: %d disaggregated answers, %g prefills on the prefiller, %g decodes on pulled KV.\n",
			disaggOK, sum(prefills), sum(pulled))
	default:
		fmt.Fprintf(w, "verdict: the split is NOT operating: %d disaggregated answers but %g decodes on pulled KV.\n", disaggOK, sum(pulled))
		return fmt.Errorf("split not operating")
	}
	return nil
}
