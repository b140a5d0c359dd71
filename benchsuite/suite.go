// Package benchsuite is `make bench`: it starts engine-sim, pd-sidecar,
// nginx and an optional peer sidecar on loopback, drives them side by side
// with loadgen in one interleaved run, and reports throughput, latency,
// proxy CPU per request and memory per open stream as ratios within that
// run.
package benchsuite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// Options configures a suite run.
type Options struct {
	// Bin holds the engine-sim and pd-sidecar binaries.
	Bin string
	// Nginx is the nginx binary ("" skips nginx).
	Nginx string
	// Peer is another sidecar binary with llm-d-compatible flags ("" skips).
	Peer string
	// Previous is an earlier build of pd-sidecar, run with exactly the
	// sidecar's flags as previous and previous-pd ("" skips it).
	Previous string
	// RefProxy is the pd-bench binary whose refproxy command serves Go's
	// net/http/httputil.ReverseProxy as a reference ("" skips it).
	RefProxy string
	// Dir receives logs and configuration files.
	Dir string
	// Clients, Duration, Rounds and Warmup shape the short-prompt
	// scenario's saturation run.
	Clients  int
	Duration time.Duration
	Rounds   int
	Warmup   time.Duration
	// Rate is the open-loop arrival rate of the latency run (0 skips it).
	Rate float64
	// Streams is the number of concurrent open streams of the memory run
	// (0 skips it).
	Streams int
	// Ramp is the number of slow streams the ramp run opens through each
	// target, at RampRate (0 skips it).
	Ramp int
	// RampRate is the ramp's arrivals per second (0: all at once).
	RampRate float64
	// Short runs the short-prompt scenario: saturation, the open-loop
	// latency run at Rate, the ramp run with Ramp and the memory run with
	// Streams.
	Short bool
	// Long is the long-prompt scenario (no lengths: skipped).
	Long LongOptions
	// Plot, when set, receives the saturation run's PNG.
	Plot string
	// JSON, when set, receives every report as JSON.
	JSON string
	// Traced also runs the sidecar with --tracing on, every span sampled
	// and exported over OTLP/HTTP to a sink in this process, as
	// sidecar-traced and sidecar-pd-traced.
	Traced bool
}

// proxyUnderTest is one proxy process and the target that drives it.
type proxyUnderTest struct {
	name   string
	p      *proc
	target loadgen.Target
}

// Run executes the suite and writes the report to w.
func Run(ctx context.Context, o Options, w io.Writer) error {
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	o.Dir = dir
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	rep := &report{}
	if o.Short {
		rg, err := startRig(ctx, o, filepath.Join(o.Dir, "short"), nil, false)
		if err == nil {
			memory := func() (map[string]streamMem, error) { return streamMemory(ctx, o, rg.launch, rg.ports[9:]) }
			ramp := func() (*rampReport, error) { return runRamp(ctx, o, filepath.Join(o.Dir, "short", "ramp"), w) }
			err = runShort(ctx, o, w, rg.proxies, rg.targets, rep, ramp, memory)
		}
		if rg != nil {
			rg.stop()
		}
		if err != nil {
			return err
		}
		writeCosts(w, rep.Costs)
	}
	if len(o.Long.Words) > 0 {
		// The nixlv2 handoff moves KV between the engines, never through
		// the sidecar: engine-sim's KV is made small (8 bytes a token) and
		// its cache large enough for the prompts held until pulled, so
		// the engines' own copying does not take the cores the proxies
		// are measured on.
		// The sidecars also run as the chart deploys them by default
		// (GOMAXPROCS=1, from its 500m CPU request): with an idle second
		// processor, Go's scheduler wakes a thread to look for work on it
		// at every wake-up of the loop, which a long-prompt run at a low
		// rate pays for on every request.
		rg, err := startRig(ctx, o, filepath.Join(o.Dir, "long"), []string{"--kv-bytes-per-token", "8", "--num-kv-blocks", "131072"}, true)
		if err == nil {
			err = runLong(ctx, o.Long, w, rg.proxies, rg.targets, rep)
		}
		if rg != nil {
			rg.stop()
		}
		if err != nil {
			return fmt.Errorf("long-prompt run: %w", err)
		}
	}
	writeBudget(w, rep)
	if o.JSON != "" {
		return rep.writeJSON(o.JSON)
	}
	return nil
}

// rig is the processes a scenario drives: the engines and the proxies in
// front of them, and the targets in the order they are reported.
type rig struct {
	procs   []*proc
	closers []func() // what the rig started in this process (the OTLP sink)
	proxies []proxyUnderTest
	targets []loadgen.Target
	// launch starts a process of the rig; ports are the rig's free ports.
	launch func(name, bin string, args ...string) (*proc, error)
	ports  []int
}

func (rg *rig) stop() {
	for _, p := range rg.procs {
		p.stop()
	}
	for _, c := range rg.closers {
		c()
	}
}

// startRig starts a scenario's engines (engine-sim at zero work, with
// engineArgs added) and proxies, logs and configuration in dir, and waits
// until every one answers; with oneP, the sidecars also run with
// GOMAXPROCS=1, as sidecar-1p and sidecar-pd-1p. The rig returned with an
// error holds what was started, to stop.
func startRig(ctx context.Context, o Options, dir string, engineArgs []string, oneP bool) (*rig, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rg := &rig{}
	rg.launch = func(name, bin string, args ...string) (*proc, error) {
		p, err := start(dir, name, bin, args...)
		if err == nil {
			rg.procs = append(rg.procs, p)
		}
		return p, err
	}
	launch := rg.launch
	ports, err := freePorts(18)
	if err != nil {
		return nil, err
	}
	rg.ports = ports
	engine, prefill := ports[0], ports[1]
	fast := []string{"--prefill-us-per-token", "0", "--decode-us-per-token", "0", "--default-max-tokens", "16",
		"--model", "sim-model", "--log-level", "warn"}
	fast = append(fast, engineArgs...)
	if _, err := launch("engine-decode", filepath.Join(o.Bin, "engine-sim"),
		append([]string{"--role", "decode", "--port", itoa(engine)}, fast...)...); err != nil {
		return rg, err
	}
	if _, err := launch("engine-prefill", filepath.Join(o.Bin, "engine-sim"),
		append([]string{"--role", "prefill", "--port", itoa(prefill), "--kv-port", itoa(ports[2]), "--bootstrap-port", itoa(ports[3])}, fast...)...); err != nil {
		return rg, err
	}
	sidecarArgs := func(port, upstream int) []string {
		return []string{"--port", itoa(port), "--model-server-port", itoa(upstream), "--log-level", "warn"}
	}
	add := func(name string, p *proc, port int, prefiller string) {
		rg.proxies = append(rg.proxies, proxyUnderTest{name: name, p: p,
			target: loadgen.Target{Name: name, URL: baseURL(port), Prefiller: prefiller}})
	}
	sc, err := launch("sidecar", filepath.Join(o.Bin, "pd-sidecar"), sidecarArgs(ports[4], engine)...)
	if err != nil {
		return rg, err
	}
	add("sidecar", sc, ports[4], "")
	scPD, err := launch("sidecar-pd", filepath.Join(o.Bin, "pd-sidecar"), sidecarArgs(ports[5], engine)...)
	if err != nil {
		return rg, err
	}
	add("sidecar-pd", scPD, ports[5], hostPort(prefill))
	if o.Traced {
		if err := rg.startTraced(dir, filepath.Join(o.Bin, "pd-sidecar"), engine, hostPort(prefill), sidecarArgs, add); err != nil {
			return rg, err
		}
	}
	if o.Previous != "" {
		// The same flags as the sidecar's, so the ratios against it are
		// the code's alone.
		for i, t := range []struct{ name, prefiller string }{{"previous", ""}, {"previous-pd", hostPort(prefill)}} {
			p, err := launch(t.name, o.Previous, sidecarArgs(ports[16+i], engine)...)
			if err != nil {
				return rg, err
			}
			add(t.name, p, ports[16+i], t.prefiller)
		}
	}
	if oneP {
		one := []string{"GOMAXPROCS=1"}
		sc1, err := startEnv(dir, "sidecar-1p", filepath.Join(o.Bin, "pd-sidecar"), one, sidecarArgs(ports[9], engine)...)
		if err != nil {
			return rg, err
		}
		rg.procs = append(rg.procs, sc1)
		add("sidecar-1p", sc1, ports[9], "")
		scPD1, err := startEnv(dir, "sidecar-pd-1p", filepath.Join(o.Bin, "pd-sidecar"), one, sidecarArgs(ports[10], engine)...)
		if err != nil {
			return rg, err
		}
		rg.procs = append(rg.procs, scPD1)
		add("sidecar-pd-1p", scPD1, ports[10], hostPort(prefill))
	}
	if o.Nginx != "" {
		p, err := startNginx(dir, o.Nginx, ports[6], engine)
		if err != nil {
			return rg, err
		}
		rg.procs = append(rg.procs, p)
		add("nginx", p, ports[6], "")
	}
	if o.RefProxy != "" {
		p, err := launch("go-proxy", o.RefProxy, "refproxy", "--port", itoa(ports[13]), "--upstream", hostPort(engine))
		if err != nil {
			return rg, err
		}
		add("go-proxy", p, ports[13], "")
	}
	if o.Peer != "" {
		peerArgs := func(port int) []string {
			return []string{"--port", itoa(port), "--model-server-port", itoa(engine), "--secure-proxy=false", "--kv-connector", "nixlv2"}
		}
		p, err := launch("peer", o.Peer, peerArgs(ports[7])...)
		if err != nil {
			return rg, err
		}
		add("peer", p, ports[7], "")
		p2, err := launch("peer-pd", o.Peer, peerArgs(ports[8])...)
		if err != nil {
			return rg, err
		}
		add("peer-pd", p2, ports[8], hostPort(prefill))
	}
	for _, u := range []string{baseURL(engine) + "/health", baseURL(prefill) + "/health"} {
		if err := waitHTTP(ctx, u, 20*time.Second); err != nil {
			return rg, err
		}
	}
	for _, px := range rg.proxies {
		if err := waitHTTP(ctx, px.target.URL+"/v1/models", 20*time.Second); err != nil {
			return rg, fmt.Errorf("%s: %w", px.name, err)
		}
	}

	direct := loadgen.Target{Name: "direct", URL: baseURL(engine)}
	floor := loadgen.Target{Name: "floor", URL: baseURL(engine), PrefillURL: baseURL(prefill)}
	rg.targets = []loadgen.Target{direct}
	for _, px := range rg.proxies {
		if px.target.Prefiller == "" {
			rg.targets = append(rg.targets, px.target)
		}
	}
	rg.targets = append(rg.targets, floor)
	for _, px := range rg.proxies {
		if px.target.Prefiller != "" {
			rg.targets = append(rg.targets, px.target)
		}
	}
	return rg, nil
}

// runShort is the short-prompt scenario: the saturation run, the open-loop
// latency run, the ramp run and the open-streams memory run (memory runs
// the last).
func runShort(ctx context.Context, o Options, w io.Writer, proxies []proxyUnderTest, targets []loadgen.Target, rep *report,
	ramp func() (*rampReport, error), memory func() (map[string]streamMem, error)) error {
	work := loadgen.Workload{API: loadgen.APIChat, Model: "sim-model", Stream: true,
		PromptTokens: loadgen.Dist{Min: 128, Max: 128}, OutputTokens: loadgen.Dist{Min: 16, Max: 16}, Seed: 1, Distinct: 256}
	reqs := work.Generate()

	fmt.Fprintf(w, "pd-bench suite: engine-sim (zero-work timing, 16 SSE events per stream), %d clients, %d rounds × %v per target\n\n",
		o.Clients, o.Rounds, o.Duration)
	if o.Warmup > 0 {
		// Warm every target outside the measured window, so the CPU
		// snapshots below cover exactly the recorded requests.
		warm := loadgen.Load{Clients: o.Clients, Duration: o.Warmup, Rounds: 1}
		if _, err := loadgen.Run(ctx, work.API, targets, reqs, warm, nil); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	before := usageOf(proxies)
	sat := loadgen.Load{Clients: o.Clients, Duration: o.Duration, Rounds: o.Rounds}
	satRes, err := loadgen.Run(ctx, work.API, targets, reqs, sat, progress(w))
	if err != nil {
		return fmt.Errorf("saturation run: %w", err)
	}
	after := usageOf(proxies)
	rep.Saturation = summarize("saturation: closed loop", satRes)
	if err := writeTable(w, rep.Saturation); err != nil {
		return err
	}
	rep.Costs = costs(proxies, before, after, satRes)
	if o.Plot != "" {
		if err := loadgen.WritePlot(o.Plot, satRes); err != nil {
			return err
		}
		fmt.Fprintf(w, "plot: %s\n", o.Plot)
	}

	if o.Rate > 0 {
		fmt.Fprintf(w, "\nlatency at %.0f req/s (open loop, Poisson arrivals)\n", o.Rate)
		open := loadgen.Load{Rate: o.Rate, Poisson: true, Duration: o.Duration, Rounds: o.Rounds, Warmup: o.Warmup}
		openRes, err := loadgen.Run(ctx, work.API, targets, reqs, open, progress(w))
		if err != nil {
			return fmt.Errorf("open-loop run: %w", err)
		}
		rep.OpenLoop = summarize(fmt.Sprintf("open loop %.0f req/s", o.Rate), openRes)
		if err := writeTable(w, rep.OpenLoop); err != nil {
			return err
		}
	}
	if o.Ramp > 0 {
		r, err := ramp()
		if err != nil {
			return fmt.Errorf("ramp run: %w", err)
		}
		rep.Ramp = r
	}
	if o.Streams > 0 {
		mem, err := memory()
		if err != nil {
			return fmt.Errorf("open-streams run: %w", err)
		}
		for _, name := range []string{"sidecar-goroutines"} {
			if _, ok := mem[name]; ok {
				rep.Costs = append(rep.Costs, proxyCost{Proxy: name})
			}
		}
		for i := range rep.Costs {
			if m, ok := mem[rep.Costs[i].Proxy]; ok {
				rep.Costs[i].StreamsOpen = m.streams
				rep.Costs[i].RSSIdleMiB = m.idle
				rep.Costs[i].RSSStreamsMiB = m.open
				rep.Costs[i].KBPerStream = m.perStreamKB
				rep.Costs[i].CPUPerEvent = m.usPerEvent
			}
		}
	}
	return nil
}

func progress(w io.Writer) loadgen.Progress {
	return func(round, rounds int, target string, done int) {
		fmt.Fprintf(os.Stderr, "\r  round %d/%d  %-12s %8d requests   ", round, rounds, target, done)
	}
}

func usageOf(proxies []proxyUnderTest) map[string]procUsage {
	out := map[string]procUsage{}
	for _, px := range proxies {
		u, err := treeUsage(px.p.pid())
		if err == nil {
			out[px.name] = u
		}
	}
	return out
}

// errNoProxy is returned when a memory run has no proxy to measure.
var errNoProxy = errors.New("no proxy to measure")

func itoa(i int) string { return fmt.Sprint(i) }

// startTraced starts sidecar-traced and sidecar-pd-traced: the sidecar
// with --tracing, every span sampled (parentbased_always_on) and exported
// over OTLP/HTTP to a sink in this process that reads and drops them, as a
// collector would take them.
func (rg *rig) startTraced(dir, bin string, engine int, prefiller string, args func(port, upstream int) []string,
	add func(name string, p *proc, port int, prefiller string)) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK) // an empty ExportTraceServiceResponse
	})}
	go func() { _ = srv.Serve(ln) }()
	rg.closers = append(rg.closers, func() { _ = srv.Close() })
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + ln.Addr().String(), "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_TRACES_SAMPLER=parentbased_always_on"}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	for i, t := range []struct{ name, prefiller string }{{"sidecar-traced", ""}, {"sidecar-pd-traced", prefiller}} {
		p, err := startEnv(dir, t.name, bin, env, append(args(ports[i], engine), "--tracing")...)
		if err != nil {
			return err
		}
		rg.procs = append(rg.procs, p)
		add(t.name, p, ports[i], t.prefiller)
	}
	return nil
}
