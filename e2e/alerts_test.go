package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/deploy/grafana"
	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// The alert and recording rules of deploy/prometheus, and every query of
// the Grafana dashboard, evaluated by a real Prometheus that scrapes real
// sidecars and engine-sims while traffic runs. Each traffic class has a
// namespace of its own (the scrape's label, as a ServiceMonitor sets it):
//
//   - healthy: splits over NIXL-style engine pull with multi-turn KV reuse,
//     splits over the sidecar's own KV pull, streams, and clients that leave
//     mid-stream. No alert may fire here, ever.
//   - dead-prefiller: the header names a port nothing listens on.
//   - failing-prefiller: the prefiller answers every prefill 500.
//   - slow-kv: the decode engine takes 1.5 s to answer a leg that carries
//     remote KV.
//   - kv-failing: the prefiller's KV arrives corrupted; every pull fails its
//     checksum.
//   - no-prefiller: the endpoint picker names no prefiller (splits turned
//     off upstream).
//   - down: a scrape target of the sidecars' job where nothing answers.
//
// The rules run with their windows and for: durations shortened (a minute
// of the file is alertMinute here), so that the test waits seconds, not
// quarters of an hour. Nothing is asserted on timing: the test waits, with
// a generous bound, until every expected alert fires, then reads what
// happened from Prometheus' own record (the ALERTS series).

// alertMinute is what a minute of the rules file becomes in this test.
const alertMinute = 2 * time.Second

var (
	ruleRange = regexp.MustCompile(`\[(\d+)m\]`)
	ruleFor   = regexp.MustCompile(`(?m)^(\s+for:\s+)(\d+)m\s*$`)
)

// shortenRules rewrites every [Nm] range and for: Nm of rules to N
// alertMinutes.
func shortenRules(t *testing.T, rules string) string {
	t.Helper()
	secs := func(m string) string {
		n, err := strconv.Atoi(m)
		require.NoError(t, err)
		return strconv.Itoa(n*int(alertMinute/time.Second)) + "s"
	}
	out := ruleRange.ReplaceAllStringFunc(rules, func(s string) string {
		return "[" + secs(ruleRange.FindStringSubmatch(s)[1]) + "]"
	})
	out = ruleFor.ReplaceAllStringFunc(out, func(s string) string {
		m := ruleFor.FindStringSubmatch(s)
		return m[1] + secs(m[2])
	})
	require.NotContains(t, out, "m]", "every range shortened")
	return out
}

func TestShortenRules(t *testing.T) {
	in := "expr: rate(x[5m]) / rate(y[15m])\n        for: 10m\n"
	assert.Equal(t, "expr: rate(x[10s]) / rate(y[30s])\n        for: 20s", strings.TrimSpace(shortenRules(t, in)))
}

// alertTarget is one scrape target: a /metrics endpoint with the labels
// its series get.
type alertTarget struct {
	job, hostPort, namespace, pod string
}

func scrapeConfig(targets []alertTarget) string {
	var b strings.Builder
	b.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yaml]\nscrape_configs:\n")
	jobs := map[string][]alertTarget{}
	var order []string
	for _, tg := range targets {
		if _, ok := jobs[tg.job]; !ok {
			order = append(order, tg.job)
		}
		jobs[tg.job] = append(jobs[tg.job], tg)
	}
	for _, job := range order {
		fmt.Fprintf(&b, "  - job_name: %s\n    static_configs:\n", job)
		for _, tg := range jobs[job] {
			fmt.Fprintf(&b, "      - targets: [%q]\n        labels: {namespace: %q, pool: %q, pod: %q}\n", tg.hostPort, tg.namespace, "pool-"+tg.namespace, tg.pod)
		}
	}
	return b.String()
}

// trafficLoop sends requests through one sidecar until ctx ends (or a
// bound on their number is reached), and counts what it got.
type trafficLoop struct {
	name     string
	send     func(ctx context.Context, i int) (status int, err error)
	sent, ok atomic.Int64
	mu       sync.Mutex
	bad      []string // the first unexpected answers
}

func (l *trafficLoop) run(ctx context.Context, wg *sync.WaitGroup) {
	defer wg.Done()
	for i := 0; i < 5000 && ctx.Err() == nil; i++ {
		st, err := l.send(ctx, i)
		if ctx.Err() != nil {
			return
		}
		l.sent.Add(1)
		if err == nil && st == http.StatusOK {
			l.ok.Add(1)
		} else {
			l.mu.Lock()
			if len(l.bad) < 5 {
				l.bad = append(l.bad, fmt.Sprintf("request %d: status %d, %v", i, st, err))
			}
			l.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// post sends body to url with headers and reads the whole answer.
func post(ctx context.Context, url, body string, headers map[string]string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, b, err
}

// leaveMidStream opens a long stream, reads its first event and leaves:
// the sidecar counts a client disconnect.
func leaveMidStream(ctx context.Context, url, body string, headers map[string]string) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		return resp.StatusCode, fmt.Errorf("no first event: %q %v", line, err)
	}
	return resp.StatusCode, nil // the body is closed unread: the client left
}

func chatMessages(msgs []map[string]any, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": maxTokens, "stream": stream})
	return string(b)
}

func TestAlertsOverRealTraffic(t *testing.T) {
	harness.PrometheusBinary(t) // skips (or fails) before anything starts
	rulesFile, err := os.ReadFile(harness.RepoRoot(t) + "/deploy/prometheus/pd-sidecar-rules.yaml")
	require.NoError(t, err)

	// The engines. healthy: a bidirectional prefill/decode pair (NIXL-style
	// engine pull, multi-turn KV reuse) and a pair with kvtransfer agents
	// (the sidecar's own pull). The failing classes share a plain decoder.
	bidi := []string{"--bidirectional-kv-xfer", "--log-level", "warn"}
	prefill := harness.StartEngineSim(t, "prefill", bidi...)
	decode := harness.StartEngineSim(t, "decode", bidi...)
	agent := func(extra ...string) []string {
		return append([]string{"--kv-agent-transport", "tcp", "--kv-agent-port", itoa(harness.FreePort(t)), "--kv-region-dir", t.TempDir(),
			"--num-kv-blocks", "2048", "--kv-bandwidth", "0", "--log-level", "warn"}, extra...)
	}
	pullPrefill := harness.StartEngineSim(t, "prefill", agent()...)
	pullDecode := harness.StartEngineSim(t, "decode", agent()...)
	corruptPrefill := harness.StartEngineSim(t, "prefill", agent("--faults", `{"corrupt_kv":true,"only":"prefill"}`)...)
	plainDecode := harness.StartEngineSim(t, "decode", "--log-level", "warn")
	failingPrefill := harness.StartEngineSim(t, "prefill", "--faults", `{"status":500}`, "--log-level", "warn")
	slowDecode := harness.StartEngineSim(t, "decode", "--faults", `{"latency_ms":1500,"only":"decode"}`, "--log-level", "warn")
	deadPrefiller := harness.HostPort(harness.FreePort(t)) // nothing listens here
	goneSidecar := harness.HostPort(harness.FreePort(t))   // a sidecar that does not answer its scrape

	quiet := []string{"--log-level", "warn"}
	pull := []string{"--kv-connector", "sidecar", "--kv-transport", "tcp", "--log-level", "warn"}
	// The circuit stays open once open: every later request is a
	// circuit_open fallback, and the open-circuit gauge never drops.
	stayOpen := []string{"--circuit-breaker-cooldown", "1h", "--log-level", "warn"}
	// Its pod's address is 127.0.0.1 (--host; POD_IP would tell every
	// sidecar here), where the decode engine's side channel listens.
	healthy := harness.StartSidecar(t, decode.Port, append([]string{"--enable-bidirectional-kv-xfer", "--host", "127.0.0.1",
		"--decode-side-channel-port", itoa(decode.KVPort)}, quiet...)...)
	healthyPull := harness.StartSidecar(t, pullDecode.Port, pull...)
	dead := harness.StartSidecar(t, plainDecode.Port, stayOpen...)
	failing := harness.StartSidecar(t, plainDecode.Port, append([]string{"--prefill-max-retries", "1", "--prefill-retry-backoff", "10ms"}, stayOpen...)...)
	kvFailing := harness.StartSidecar(t, pullDecode.Port, pull...)
	noPrefiller := harness.StartSidecar(t, plainDecode.Port, quiet...)
	slowKV := harness.StartSidecar(t, slowDecode.Port, quiet...)

	targets := []alertTarget{
		{"pd-sidecar", harness.HostPort(healthy.Port), "healthy", "decode-nixl"},
		{"pd-sidecar", harness.HostPort(healthyPull.Port), "healthy", "decode-pull"},
		{"pd-sidecar", harness.HostPort(dead.Port), "dead-prefiller", "decode-0"},
		{"pd-sidecar", harness.HostPort(failing.Port), "failing-prefiller", "decode-0"},
		{"pd-sidecar", harness.HostPort(kvFailing.Port), "kv-failing", "decode-0"},
		{"pd-sidecar", harness.HostPort(noPrefiller.Port), "no-prefiller", "decode-0"},
		{"pd-sidecar", harness.HostPort(slowKV.Port), "slow-kv", "decode-0"},
		{"pd-sidecar", goneSidecar, "down", "decode-gone"},
		{"engine-sim", prefill.HostPort(), "healthy", "prefill-nixl"},
		{"engine-sim", decode.HostPort(), "healthy", "decode-nixl"},
		{"engine-sim", pullPrefill.HostPort(), "healthy", "prefill-pull"},
		{"engine-sim", pullDecode.HostPort(), "healthy", "decode-pull"},
		{"engine-sim", corruptPrefill.HostPort(), "kv-failing", "prefill-0"},
		{"engine-sim", failingPrefill.HostPort(), "failing-prefiller", "prefill-0"},
		{"engine-sim", plainDecode.HostPort(), "failing-prefiller", "decode-0"},
		{"engine-sim", slowDecode.HostPort(), "slow-kv", "decode-0"},
	}
	prom := harness.StartPrometheus(t, scrapeConfig(targets), map[string]string{"rules.yaml": shortenRules(t, string(rulesFile))})

	// The traffic.
	named := func(p string) map[string]string { return map[string]string{"x-prefiller-host-port": p} }
	completion := func(sc *harness.Sidecar, header map[string]string) func(ctx context.Context, i int) (int, error) {
		return func(ctx context.Context, i int) (int, error) {
			st, _, err := post(ctx, sc.URL()+"/v1/completions", tokenPrompt(120+i%40, 4, ""), header)
			return st, err
		}
	}
	var leftMidStream atomic.Int64
	loops := []*trafficLoop{
		{name: "healthy, engine pull", send: func(ctx context.Context, i int) (int, error) {
			url := healthy.URL() + "/v1/chat/completions"
			hdr := named(prefill.HostPort())
			switch i % 4 {
			case 0: // two turns of one conversation: the second reuses the first's KV
				hdr["x-session-token"] = "conversation-" + itoa(i)
				first := []map[string]any{user(uint64(i), 100)}
				st, b, err := post(ctx, url, chatMessages(first, 8, false), hdr)
				if err != nil || st != http.StatusOK {
					return st, err
				}
				second := append(first, map[string]any{"role": "assistant", "content": gjson.GetBytes(b, "choices.0.message.content").String()},
					user(uint64(i)+1, 12))
				st, _, err = post(ctx, url, chatMessages(second, 8, false), hdr)
				return st, err
			case 1: // a stream
				st, b, err := post(ctx, url, chatMessages([]map[string]any{user(uint64(i), 60)}, 8, true), hdr)
				if err == nil && !strings.Contains(string(b), "[DONE]") {
					err = fmt.Errorf("stream without [DONE]: %.200s", b)
				}
				return st, err
			case 2: // a client that leaves mid-stream (the decode runs 2 ms a token)
				st, err := leaveMidStream(ctx, url, chatMessages([]map[string]any{user(uint64(i), 60)}, 2000, true), hdr)
				if err == nil {
					leftMidStream.Add(1)
				}
				return st, err
			}
			st, _, err := post(ctx, healthy.URL()+"/v1/completions", tokenPrompt(100+i%50, 4, ""), hdr)
			return st, err
		}},
		{name: "healthy, sidecar pull", send: completion(healthyPull, named(pullPrefill.HostPort()))},
		{name: "dead prefiller", send: completion(dead, named(deadPrefiller))},
		{name: "failing prefiller", send: completion(failing, named(failingPrefill.HostPort()))},
		{name: "corrupted KV", send: completion(kvFailing, named(corruptPrefill.HostPort()))},
		{name: "no prefiller named", send: completion(noPrefiller, nil)},
		{name: "slow KV transfer", send: completion(slowKV, named(prefill.HostPort()))},
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Add(1)
		go l.run(ctx, &wg)
	}
	stopTraffic := sync.OnceFunc(func() { stop(); wg.Wait() })
	t.Cleanup(stopTraffic) // before the processes are stopped

	// The alerts each class must raise; every other alert must stay silent.
	expected := map[string][]string{
		"dead-prefiller":    {"PDSidecarNotSplitting", "PDSidecarFallbackRatioHigh", "PDSidecarCircuitOpen"},
		"failing-prefiller": {"PDSidecarNotSplitting", "PDSidecarFallbackRatioHigh", "PDSidecarCircuitOpen"},
		"kv-failing":        {"PDSidecarNotSplitting", "PDSidecarFallbackRatioHigh"},
		"no-prefiller":      {"PDSidecarNoPrefillerNamed"},
		"slow-kv":           {"PDSidecarKVTransferSlow"},
		"down":              {"PDSidecarDown"},
	}
	firing := func() map[string]bool {
		out := map[string]bool{}
		for _, a := range prom.Alerts(t) {
			if a.State == "firing" {
				out[a.Labels["namespace"]+"/"+a.Labels["alertname"]] = true
			}
		}
		return out
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		now := firing()
		var missing []string
		for ns, names := range expected {
			for _, n := range names {
				if !now[ns+"/"+n] {
					missing = append(missing, ns+"/"+n)
				}
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			sort.Strings(missing)
			t.Fatalf("not firing within 5 minutes: %v; alerts now: %+v; targets: %v", missing, prom.Alerts(t), prom.Targets(t))
		}
		time.Sleep(500 * time.Millisecond)
	}

	// What fired, and why, from the alerts themselves.
	reasons := map[string]string{}
	var slowFrom []string
	for _, a := range prom.Alerts(t) {
		if a.State == "firing" && a.Labels["alertname"] == "PDSidecarFallbackRatioHigh" {
			reasons[a.Labels["namespace"]] += a.Labels["reason"] + " "
		}
		if a.State == "firing" && a.Labels["alertname"] == "PDSidecarKVTransferSlow" {
			slowFrom = append(slowFrom, a.Labels["prefiller"])
		}
	}
	assert.Equal(t, []string{prefill.HostPort()}, slowFrom, "the slow transfers are the prefiller's")
	assert.Contains(t, reasons["dead-prefiller"], "circuit_open", "the circuit opened on the dead prefiller: %v", reasons)
	assert.Contains(t, reasons["failing-prefiller"], "circuit_open", "%v", reasons)
	assert.Contains(t, reasons["kv-failing"], "kv_load_failed", "%v", reasons)

	// Prometheus' own record of every alert it ever evaluated: only the
	// expected ones, in their namespace, each pending before it fired.
	history := map[string]map[string]bool{} // namespace/alertname → states
	for _, s := range prom.Query(t, `count by (namespace, alertname, alertstate) (present_over_time(ALERTS[1h]))`) {
		k := s.Labels["namespace"] + "/" + s.Labels["alertname"]
		if history[k] == nil {
			history[k] = map[string]bool{}
		}
		history[k][s.Labels["alertstate"]] = true
	}
	for ns, names := range expected {
		for _, n := range names {
			states := history[ns+"/"+n]
			assert.True(t, states["pending"], "%s/%s went pending first (for: is not zero): %v", ns, n, states)
			assert.True(t, states["firing"], "%s/%s fired: %v", ns, n, states)
		}
	}
	for k, states := range history {
		ns, name, _ := strings.Cut(k, "/")
		if slices.Contains(expected[ns], name) {
			continue
		}
		if name == "PDSidecarNotScraped" && !states["firing"] {
			// absent(up) holds from Prometheus' start to its first scrape:
			// pending for that second, it fires only after 10 minutes of
			// no scrape at all.
			continue
		}
		assert.Fail(t, "an alert that must stay silent was raised", "%s in namespace %q: %v", name, ns, states)
	}

	// The recording rules over this traffic.
	ratio := func(expr string) map[string]float64 {
		out := map[string]float64{}
		for _, s := range prom.Query(t, expr) {
			out[s.Labels["namespace"]+"/"+s.Labels["prefiller"]+"/"+s.Labels["reason"]] = s.Value
		}
		return out
	}
	split := ratio(`pool:pd_sidecar_split_ratio:rate5m`)
	assert.Equal(t, 1.0, split["healthy//"], "every named request in healthy was split: %v", split)
	assert.Equal(t, 1.0, split["slow-kv//"], "slow transfers are still splits: %v", split)
	for _, ns := range []string{"dead-prefiller", "failing-prefiller", "kv-failing"} {
		v, ok := split[ns+"//"]
		assert.True(t, ok && v == 0, "the split ratio of %s is 0, not missing: %v", ns, split)
	}
	_, ok := split["no-prefiller//"]
	assert.False(t, ok, "no request named a prefiller in no-prefiller: no ratio")
	perPrefiller := ratio(`prefiller:pd_sidecar_split_ratio:rate5m`)
	assert.Equal(t, 1.0, perPrefiller["healthy/"+prefill.HostPort()+"/"], "%v", perPrefiller)
	assert.Equal(t, 1.0, perPrefiller["healthy/"+pullPrefill.HostPort()+"/"], "%v", perPrefiller)
	assert.Equal(t, 0.0, perPrefiller["failing-prefiller/"+failingPrefill.HostPort()+"/"], "%v", perPrefiller)
	fellBack := ratio(`prefiller:pd_sidecar_fallback_ratio:rate5m > 0`)
	assert.InDelta(t, 1.0, fellBack["kv-failing/"+corruptPrefill.HostPort()+"/kv_load_failed"], 0.01, "%v", fellBack)

	// The work behind the healthy numbers, from the engines' and the
	// sidecars' proof counters as Prometheus scraped them.
	for expr, what := range map[string]string{
		`sum(sim_remote_kv_decodes_total{namespace="healthy"})`:                "decodes ran on KV pulled from the prefiller",
		`sum(sim_kv_preloaded_decodes_total{namespace="healthy"})`:             "decodes ran on KV the sidecar pulled",
		`sum(pd_sidecar_multiturn_uses_total{namespace="healthy"})`:            "turns reused the conversation's KV",
		`sum(pd_sidecar_client_disconnects_total{namespace="healthy"})`:        "clients that left were counted",
		`sum(pd_sidecar_kv_pull_failures_total{namespace="kv-failing"})`:       "corrupted pulls were refused",
		`sum(pd_sidecar_prefill_retries_total{namespace="failing-prefiller"})`: "failed prefills were retried",
	} {
		got := prom.Query(t, expr)
		require.Len(t, got, 1, "%s: %s", what, expr)
		assert.Positive(t, got[0].Value, "%s: %s", what, expr)
	}

	// Every query of the dashboard returns data, with every variable at
	// All.
	queries, err := grafana.Queries(grafana.JSON)
	require.NoError(t, err)
	vars := strings.NewReplacer(`$namespace`, `.*`, `$pool`, `.*`, `$pod`, `.*`, `$prefiller`, `.*`, `$__rate_interval`, `1m`)
	for _, dq := range queries {
		where, q := dq.Where, vars.Replace(dq.Expr)
		if inner, ok := strings.CutPrefix(q, "label_values("); ok {
			// label_values(selector, label): the label's values.
			i := strings.LastIndexByte(inner, ',')
			label := strings.TrimSpace(strings.TrimSuffix(inner[i+1:], ")"))
			q = "count by (" + label + ") (" + inner[:i] + ")"
		}
		got := prom.Query(t, q)
		assert.NotEmpty(t, got, "%s returns no data: %s", where, q)
		for _, s := range got {
			assert.False(t, math.IsInf(s.Value, 0), "%s: %s", where, s)
		}
	}

	stopTraffic()
	for _, l := range loops {
		l.mu.Lock()
		assert.Empty(t, l.bad, "%s: every request answered 200 (%d of %d)", l.name, l.ok.Load(), l.sent.Load())
		l.mu.Unlock()
		assert.Positive(t, l.sent.Load(), l.name)
	}
	assert.Positive(t, leftMidStream.Load())
}
