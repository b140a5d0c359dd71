package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/benchsuite"
)

// runSuite is `pd-bench suite`, the engine of `make bench`.
func runSuite(args []string) error {
	o := benchsuite.Options{}
	fs := pflag.NewFlagSet("pd-bench suite", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&o.Bin, "bin", "bin", "directory holding engine-sim and pd-sidecar")
	nginx := fs.String("nginx", "nginx", `nginx binary to compare with ("off" to skip; looked up in PATH)`)
	ref := fs.Bool("reference", true, "also run Go's net/http/httputil.ReverseProxy (pd-bench refproxy) as a reference proxy")
	fs.StringVar(&o.Peer, "peer", os.Getenv("PEER_SIDECAR"), "another sidecar binary with llm-d-compatible flags (default $PEER_SIDECAR)")
	fs.StringVar(&o.Previous, "previous", os.Getenv("PREVIOUS_SIDECAR"), "an earlier build of pd-sidecar, run with the sidecar's own flags as previous and previous-pd (default $PREVIOUS_SIDECAR; make bench builds BENCH_PREVIOUS)")
	fs.StringVar(&o.Dir, "dir", "out/bench", "directory for logs and configuration")
	fs.IntVar(&o.Clients, "clients", 32, "closed-loop clients of the saturation run")
	fs.DurationVar(&o.Duration, "duration", 3*time.Second, "time each target is driven per round")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds (targets interleaved round by round)")
	fs.DurationVar(&o.Warmup, "warmup", time.Second, "warm-up per target, not measured")
	fs.Float64Var(&o.Rate, "rate", 500, "open-loop arrivals per second of the latency run (0: skip)")
	fs.IntVar(&o.Streams, "streams", 2000, "concurrent open streams of the memory run (0: skip)")
	fs.IntVar(&o.Ramp, "ramp", 2000, "slow streams the ramp run opens through each target, TTFT timed (0: skip)")
	fs.Float64Var(&o.RampRate, "ramp-rate", 1000, "the ramp's arrivals per second (0: all released at once)")
	scenarios := fs.StringSlice("scenarios", []string{"short", "long"}, "scenarios to run: short (128-word prompts: saturation, open loop at --rate, ramp, open streams) and long (long prompts, --long-*)")
	fs.IntSliceVar(&o.Long.Words, "long-words", []int{1000, 8000, 30000, 100000}, "long scenario: prompt lengths in words (engine-sim tokens); 30000 words (~200 KB) is the budget's length")
	fs.Float64Var(&o.Long.Rate, "long-rate", 25, "long scenario: open-loop arrivals per second (Poisson) per target")
	fs.DurationVar(&o.Long.Duration, "long-duration", 2*time.Second, "long scenario: time each target is driven per round and length")
	fs.IntVar(&o.Long.Rounds, "long-rounds", 2, "long scenario: rounds per length (targets interleaved)")
	fs.DurationVar(&o.Long.Warmup, "long-warmup", 500*time.Millisecond, "long scenario: warm-up per target and length, not measured")
	fs.IntVar(&o.Long.Distinct, "long-distinct", 8, "long scenario: distinct request bodies per length (cycled)")
	fs.StringVar(&o.Plot, "plot", "out/bench.png", "PNG of the saturation run (empty: none)")
	fs.StringVar(&o.JSON, "json", "out/bench.json", "JSON report (empty: none)")
	fs.BoolVar(&o.Traced, "traced", true, "also run the sidecar with --tracing on (every span sampled, exported over OTLP/HTTP to a sink in pd-bench), as sidecar-traced and sidecar-pd-traced")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	long := false
	for _, sc := range *scenarios {
		switch sc {
		case "short":
			o.Short = true
		case "long":
			long = true
		default:
			return fmt.Errorf("--scenarios: unknown scenario %q (short, long)", sc)
		}
	}
	if !long {
		o.Long.Words = nil
	}
	if err := o.Long.Validate(); err != nil {
		return fmt.Errorf("--long-*: %w", err)
	}
	if *nginx != "off" {
		if p, err := exec.LookPath(*nginx); err == nil {
			o.Nginx = p
		} else {
			os.Stderr.WriteString("pd-bench suite: nginx not found; skipping it (make bench installs it from Debian's packages)\n")
		}
	}
	if *ref {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		o.RefProxy = self
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return benchsuite.Run(ctx, o, os.Stdout)
}

// runRefProxy is `pd-bench refproxy`: Go's standard streaming reverse proxy
// as a reference in the suite's runs.
func runRefProxy(args []string) error {
	fs := pflag.NewFlagSet("pd-bench refproxy", pflag.ContinueOnError)
	port := fs.Int("port", 0, "port to serve on (127.0.0.1)")
	upstream := fs.String("upstream", "", "host:port of the engine")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if *port <= 0 || *upstream == "" {
		return errors.New("refproxy: --port and --upstream are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return benchsuite.ServeReferenceProxy(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)), *upstream)
}
