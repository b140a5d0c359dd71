// Command pd-demo is the main job on an embedded default: it starts
// engine-sim as a prefill and a decode engine, pd-sidecar in front of the
// decoder, sends a mix of local, disaggregated and failing-prefiller
// requests through the sidecar, and prints what happened, read from the
// engines' proof counters and the sidecar's metrics.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/status"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pd-demo:", err)
		os.Exit(1)
	}
}

type options struct {
	bin      string
	requests int
	tokens   int
	verbose  bool
}

func run() error {
	var o options
	pflag.StringVar(&o.bin, "bin", "bin", "directory holding the engine-sim and pd-sidecar binaries")
	pflag.IntVar(&o.requests, "requests", 8, "requests per traffic class")
	pflag.IntVar(&o.tokens, "max-tokens", 24, "tokens generated per request")
	pflag.BoolVar(&o.verbose, "verbose", false, "print the children's logs")
	pflag.Parse()
	if o.requests < 1 || o.tokens < 1 {
		return errors.New("--requests and --max-tokens must be positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			_ = p.Wait()
		}
	}()
	start := func(name string, args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(o.bin, name), args...)
		if o.verbose {
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		procs = append(procs, cmd)
		return nil
	}
	ports, err := freePorts(8)
	if err != nil {
		return err
	}
	prefill, decode, failing, sidecar, dead := ports[0], ports[1], ports[2], ports[3], ports[4]
	simArgs := func(role string, port, kv, boot int, extra ...string) []string {
		return append([]string{"--role", role, "--port", itoa(port), "--kv-port", itoa(kv), "--bootstrap-port", itoa(boot),
			"--model", demoModel, "--prefill-us-per-token", "400", "--decode-us-per-token", "2000", "--log-level", "warn"}, extra...)
	}
	if err := start("engine-sim", simArgs("prefill", prefill, ports[5], ports[6])...); err != nil {
		return err
	}
	if err := start("engine-sim", simArgs("decode", decode, 0, 0)...); err != nil {
		return err
	}
	if err := start("engine-sim", simArgs("prefill", failing, 0, ports[7], "--faults", `{"status":500}`)...); err != nil {
		return err
	}
	if err := start("pd-sidecar", "--port", itoa(sidecar), "--model-server-port", itoa(decode),
		"--prefill-timeout", "3s", "--log-level", "warn"); err != nil {
		return err
	}
	for _, p := range []int{prefill, decode, failing, sidecar} {
		if err := waitHealthy(ctx, url(p)+"/health", 20*time.Second); err != nil {
			return err
		}
	}

	d := &demo{sidecar: url(sidecar), prefill: url(prefill), decode: url(decode), maxTokens: o.tokens}
	fmt.Printf("pd-demo: engine-sim prefill :%d, engine-sim decode :%d, failing prefiller :%d (answers 500), dead prefiller :%d (nothing listens), pd-sidecar :%d → decode\n\n",
		prefill, decode, failing, dead, sidecar)
	classes := []trafficClass{
		{name: "local (no header)", header: ""},
		{name: "disaggregated", header: hostPort(prefill)},
		{name: "disaggregated, streaming", header: hostPort(prefill), stream: true},
		{name: "prefiller dead", header: hostPort(dead)},
		{name: "prefiller answers 500", header: hostPort(failing)},
	}
	before, err := d.snapshot(ctx)
	if err != nil {
		return err
	}
	results := make([]classResult, len(classes))
	for i, c := range classes {
		results[i] = d.runClass(ctx, c, o.requests)
	}
	after, err := d.snapshot(ctx)
	if err != nil {
		return err
	}
	if err := report(os.Stdout, classes, results, before, after); err != nil {
		return err
	}
	// The sidecar's own account of the run: pd-sidecar status.
	snap, err := status.Fetch(ctx, nil, d.sidecar)
	if err != nil {
		return err
	}
	fmt.Println("\nthe sidecar's own view (pd-sidecar status --url " + d.sidecar + "):")
	return snap.WriteText(os.Stdout)
}

const demoModel = "demo-model"

func itoa(i int) string { return strconv.Itoa(i) }

func hostPort(p int) string { return net.JoinHostPort("127.0.0.1", itoa(p)) }

func url(p int) string { return "http://" + hostPort(p) }

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
