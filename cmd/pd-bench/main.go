// Command pd-bench is a load generator for OpenAI-compatible completions
// and chat endpoints that understands SSE. It drives several named targets
// in one run, interleaved round by round, and prints them side by side with
// ratios to the first target. See docs/performance.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "pd-bench:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	if len(args) > 0 && args[0] == "suite" {
		return runSuite(args[1:])
	}
	if len(args) > 0 && args[0] == "kv" {
		return runKV(args[1:])
	}
	if len(args) > 0 && args[0] == "tail" {
		return runTail(args[1:])
	}
	if len(args) > 0 && args[0] == "multiturn" {
		return runMultiturn(args[1:])
	}
	if len(args) > 0 && args[0] == "refproxy" {
		return runRefProxy(args[1:])
	}
	fs := pflag.NewFlagSet("pd-bench", pflag.ContinueOnError)
	fs.SortFlags = false
	targets := fs.StringArray("target", nil, "NAME=URL of a target (repeat; the first is the baseline of the ratios)")
	prefill := fs.StringArray("prefill-target", nil, "NAME=URL: run the nixlv2 prefill leg of target NAME against URL yourself, then its decode leg (the floor of a P/D proxy)")
	prefiller := fs.StringArray("prefiller", nil, "NAME=HOST:PORT: send x-prefiller-host-port to target NAME")
	api := fs.String("api", "chat", "chat or completions")
	model := fs.String("model", "sim-model", "model name in the requests")
	stream := fs.Bool("stream", true, "stream answers (SSE) and time every token")
	promptTokens := fs.String("prompt-tokens", "128", "prompt length in words: N or A-B (uniform)")
	outputTokens := fs.String("output-tokens", "16", "max_tokens: N or A-B (uniform)")
	shared := fs.Float64("shared-prefix", 0, "fraction of every prompt shared by all requests (0..1)")
	distinct := fs.Int("distinct", 256, "number of distinct generated requests (cycled)")
	seed := fs.Uint64("seed", 1, "workload seed")
	file := fs.String("prompts-file", "", "JSONL file of request bodies instead of the generator")
	clients := fs.Int("clients", 32, "closed loop: concurrent clients")
	rate := fs.Float64("rate", 0, "open loop: arrivals per second (0: closed loop)")
	poisson := fs.Bool("poisson", false, "open loop: Poisson arrivals instead of constant")
	duration := fs.Duration("duration", 5*time.Second, "time each target is driven per round")
	rounds := fs.Int("rounds", 3, "rounds; targets are interleaved round by round")
	warmup := fs.Duration("warmup", time.Second, "warm-up per target before the first round (not recorded)")
	timeout := fs.Duration("timeout", 60*time.Second, "per-request read/write timeout")
	jsonOut := fs.Bool("json", false, "print the report as JSON instead of a table")
	plotFile := fs.String("plot", "", "write latency CDFs and throughput to this PNG file")
	quiet := fs.Bool("quiet", false, "no progress line")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	ts, err := parseTargets(*targets, *prefill, *prefiller)
	if err != nil {
		return err
	}
	w := loadgen.Workload{API: loadgen.API(*api), Model: *model, Stream: *stream, SharedPrefix: *shared, Seed: *seed, Distinct: *distinct}
	if w.PromptTokens, err = loadgen.ParseDist(*promptTokens); err != nil {
		return fmt.Errorf("--prompt-tokens: %w", err)
	}
	if w.OutputTokens, err = loadgen.ParseDist(*outputTokens); err != nil {
		return fmt.Errorf("--output-tokens: %w", err)
	}
	if err := w.Validate(); err != nil {
		return err
	}
	reqs := w.Generate()
	workload := fmt.Sprintf("%s, prompts %s words, output %s tokens, shared prefix %.0f%%, stream %v",
		w.API, w.PromptTokens, w.OutputTokens, w.SharedPrefix*100, w.Stream)
	if *file != "" {
		f, err := os.Open(*file)
		if err != nil {
			return err
		}
		reqs, err = loadgen.ReadJSONL(f, w)
		f.Close()
		if err != nil {
			return fmt.Errorf("--prompts-file: %w", err)
		}
		workload = fmt.Sprintf("%s, %d requests from %s, stream %v", w.API, len(reqs), *file, w.Stream)
	}
	load := loadgen.Load{Clients: *clients, Rate: *rate, Poisson: *poisson, Duration: *duration,
		Rounds: *rounds, Warmup: *warmup, Timeout: *timeout}
	loadDesc := fmt.Sprintf("closed loop, %d clients", load.Clients)
	if load.Rate > 0 {
		kind := "constant"
		if load.Poisson {
			kind = "Poisson"
		}
		loadDesc = fmt.Sprintf("open loop, %.0f req/s %s arrivals", load.Rate, kind)
	}
	loadDesc += fmt.Sprintf(", %d rounds × %v per target (interleaved)", load.Rounds, load.Duration)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var progress loadgen.Progress
	if !*quiet {
		progress = func(round, rounds int, target string, done int) {
			fmt.Fprintf(os.Stderr, "\rround %d/%d  %-20s %8d requests", round, rounds, target, done)
		}
	}
	results, err := loadgen.Run(ctx, w.API, ts, reqs, load, progress)
	if !*quiet {
		fmt.Fprintln(os.Stderr)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	rep := loadgen.Report{Workload: workload, Load: loadDesc}
	for _, r := range results {
		rep.Targets = append(rep.Targets, loadgen.Summarize(r))
	}
	if *jsonOut {
		err = rep.WriteJSON(os.Stdout)
	} else {
		err = rep.WriteTable(os.Stdout)
	}
	if err != nil {
		return err
	}
	if *plotFile != "" {
		if err := loadgen.WritePlot(*plotFile, results); err != nil {
			return err
		}
		if !*jsonOut {
			fmt.Printf("plot: %s\n", *plotFile)
		}
	}
	return nil
}

func parseTargets(targets, prefill, prefiller []string) ([]loadgen.Target, error) {
	if len(targets) == 0 {
		return nil, errors.New("at least one --target NAME=URL is required")
	}
	var out []loadgen.Target
	index := map[string]int{}
	for _, t := range targets {
		name, url, ok := strings.Cut(t, "=")
		if !ok || name == "" || !strings.HasPrefix(url, "http") {
			return nil, fmt.Errorf("--target %q: want NAME=http://host:port", t)
		}
		if _, dup := index[name]; dup {
			return nil, fmt.Errorf("--target %q: name used twice", name)
		}
		index[name] = len(out)
		out = append(out, loadgen.Target{Name: name, URL: strings.TrimRight(url, "/")})
	}
	for _, p := range prefill {
		name, url, ok := strings.Cut(p, "=")
		i, known := index[name]
		if !ok || !known || !strings.HasPrefix(url, "http") {
			return nil, fmt.Errorf("--prefill-target %q: want NAME=http://host:port for a known target", p)
		}
		out[i].PrefillURL = strings.TrimRight(url, "/")
	}
	for _, p := range prefiller {
		name, hp, ok := strings.Cut(p, "=")
		i, known := index[name]
		if !ok || !known || hp == "" {
			return nil, fmt.Errorf("--prefiller %q: want NAME=host:port for a known target", p)
		}
		out[i].Prefiller = hp
	}
	return out, nil
}
