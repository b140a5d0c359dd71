// Package tailbench is `pd-bench tail` (make bench-tail): the sidecar's
// tail-latency features measured against baselines of the same run, on
// loopback with engine-sim at a mid-size model's timing. Five scenarios,
// each with its own processes, then one table of budget lines with a
// verdict each:
//
//  1. one of four prefillers slow: local only, healthy P/D, P/D with the
//     slow prefiller, and the same with hedged prefill;
//  2. a cold prefiller (the decode engine's first NIXL pull from it pays a
//     handshake) with and without --prefill-prewarm;
//  3. short prompts under --min-remote-prefill-tokens against the same
//     prompts served locally;
//  4. a prefiller killed for a few seconds under load, with and without
//     active probing of its open circuit;
//  5. a share of clients that leave right after the prefill answered,
//     before the decode engine read the KV, with and without
//     --release-kv-on-cancel: the prefillers' KV held after the load.
//
// Every engine runs with --prefill-slots (1 by default): a real engine's
// prefill is compute-bound, so the prefills a decode engine does itself
// (local requests, fallbacks, hedges) queue behind each other.
package tailbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/pd-sidecar/pd-sidecar/benchsuite"
)

// Options configure a run. DefaultOptions gives the defaults.
type Options struct {
	// Bin holds engine-sim and pd-sidecar; Dir receives the logs.
	Bin, Dir string
	// Out receives the tables.
	Out io.Writer
	// Scenarios to run, by number (1..5).
	Scenarios []int

	// The engines' timing: prefill per token, decode per token after the
	// first, the KV's simulated bytes per token and the bandwidth it is
	// pulled at, and the prefills an engine computes at once.
	PrefillPerToken, DecodePerToken time.Duration
	KVBytesPerToken                 int
	KVBandwidth                     float64
	PrefillSlots                    int

	// Scenario 1: prompt and output lengths (tokens), the open-loop
	// Poisson arrival rate, the time each target is driven per round, the
	// rounds (targets interleaved) and the warm-up per target; the slow
	// prefiller's fault; the hedge point (a duration or "auto") and budget.
	PromptTokens, OutputTokens int
	Rate                       float64
	Duration                   time.Duration
	Rounds                     int
	Warmup                     time.Duration
	SlowShare                  float64
	SlowDelay                  time.Duration
	HedgeAfter                 string
	HedgeBudget                float64

	// Scenario 2: the decode engine's handshake delay and the warm
	// requests timed after the first.
	HandshakeDelay time.Duration
	WarmRequests   int

	// Scenario 3: the short prompts' length, the guard's threshold, the
	// rate and the time per round (two rounds, two targets).
	ShortTokens, GuardTokens int
	ShortRate                float64
	ShortDuration            time.Duration

	// Scenario 4: the rate, how long the load runs before the kill, how
	// long the prefiller stays down, how long the load runs after it
	// returns, and the probe interval measured (the control runs 0).
	KillRate                        float64
	KillBefore, KillDown, KillAfter time.Duration
	ProbeInterval                   time.Duration
	CircuitFailures                 int
	CircuitCooldown                 time.Duration

	// Scenario 5: the prompt length, the rate and load time, the share of
	// clients that leave and when (after their request was due), how long
	// the decode engine holds a streamed decode leg after its head before
	// it reads the KV, the prefillers' --kv-lease, and how long the blocks
	// held are watched after the load's end.
	LeaveTokens            int
	LeaveRate              float64
	LeaveDuration          time.Duration
	LeaveShare             float64
	LeaveAfter, DecodeHold time.Duration
	KVLease, LeaveWatch    time.Duration
}

// DefaultOptions is `make bench-tail`: about 3.5 minutes on 2 cores.
func DefaultOptions() Options {
	return Options{
		Bin: "bin", Dir: "out/bench-tail", Out: os.Stdout, Scenarios: []int{1, 2, 3, 4, 5},
		// A mid-size model on one GPU: 100 µs of prefill a token (a
		// 1000-token prompt in 100 ms), 20 ms a decode step, 128 KiB of
		// KV a token moved at 25 GB/s (5 ms for 1000 tokens): simulated
		// as 1 KiB a token at 200 MB/s, the same time for 1/128 of the
		// bytes, so that loopback copies do not take the cores.
		PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 20 * time.Millisecond,
		KVBytesPerToken: 1024, KVBandwidth: 2e8, PrefillSlots: 1,
		PromptTokens: 1000, OutputTokens: 4,
		// 6 req/s of 100 ms prefills keeps a decode engine serving
		// everything locally 60 % busy prefilling.
		Rate: 6, Duration: 14 * time.Second, Rounds: 2, Warmup: 2 * time.Second,
		SlowShare: 0.1, SlowDelay: 2 * time.Second, HedgeAfter: "auto", HedgeBudget: 0.1,
		HandshakeDelay: 2 * time.Second, WarmRequests: 8,
		ShortTokens: 32, GuardTokens: 256, ShortRate: 50, ShortDuration: 4 * time.Second,
		KillRate: 200, KillBefore: 1500 * time.Millisecond, KillDown: 3 * time.Second, KillAfter: 3500 * time.Millisecond,
		ProbeInterval: 250 * time.Millisecond, CircuitFailures: 3, CircuitCooldown: 5 * time.Second,
		// 256-token prompts prefill in 26 ms: at 30 req/s over two
		// prefillers each is 38 % busy, so a prefill queues a few
		// milliseconds and has answered well before 250 ms; every decode
		// leg then waits 600 ms before it reads the KV. vLLM keeps KV no
		// decoder read for VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s.
		LeaveTokens: 256, LeaveRate: 30, LeaveDuration: 10 * time.Second, LeaveShare: 0.1,
		LeaveAfter: 250 * time.Millisecond, DecodeHold: 600 * time.Millisecond,
		KVLease: 480 * time.Second, LeaveWatch: 2 * time.Second,
	}
}

// Validate reports the first invalid option.
func (o Options) Validate() error {
	switch {
	case o.PrefillPerToken < 0 || o.DecodePerToken < 0 || o.KVBandwidth < 0 || o.KVBytesPerToken <= 0 || o.KVBytesPerToken%8 != 0:
		return errors.New("engine timing: per-token costs and bandwidth must not be negative, KV bytes a positive multiple of 8")
	case o.PrefillSlots < 0:
		return errors.New("--prefill-slots must not be negative")
	case o.PromptTokens < 1 || o.OutputTokens < 1 || o.ShortTokens < 1:
		return errors.New("prompt and output lengths must be positive")
	case o.Rate <= 0 || o.ShortRate <= 0 || o.KillRate <= 0:
		return errors.New("rates must be positive")
	case o.Duration <= 0 || o.Rounds < 1 || o.ShortDuration <= 0 || o.Warmup < 0:
		return errors.New("durations must be positive and rounds at least 1")
	case o.SlowShare < 0 || o.SlowShare > 1:
		return errors.New("--slow-share must be within 0..1")
	case o.KillBefore <= 0 || o.KillDown <= 0 || o.KillAfter <= 0:
		return errors.New("the kill phases must be positive")
	case o.WarmRequests < 1:
		return errors.New("--warm-requests must be at least 1")
	case o.LeaveTokens < 1 || o.LeaveRate <= 0 || o.LeaveDuration <= 0:
		return errors.New("scenario 5: prompt length, rate and duration must be positive")
	case o.LeaveShare <= 0 || o.LeaveShare > 1:
		return errors.New("--leave-share must be within 0 (excluded) and 1")
	case o.LeaveAfter <= 0 || o.DecodeHold <= o.LeaveAfter:
		return errors.New("--leave-after must be positive and --decode-hold longer: the clients leave while the decode leg is held")
	case o.KVLease <= o.LeaveWatch || o.LeaveWatch <= 0:
		return errors.New("--leave-watch must be positive and --kv-lease longer: else the lease, not a release, frees the KV")
	}
	for _, s := range o.Scenarios {
		if s < 1 || s > 5 {
			return fmt.Errorf("scenario %d: there are scenarios 1 to 5", s)
		}
	}
	return nil
}

// Run runs the scenarios and prints their tables and the budget table. It
// returns an error when a scenario could not be run; missed budget lines
// are reported in the table, not as an error.
func Run(ctx context.Context, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	o.Dir = dir
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	fmt.Fprintf(o.Out, "pd-bench tail: engine-sim at %v prefill a token, %v a decode step, KV %d B a token at %.0f MB/s, --prefill-slots %d on every engine; logs in %s\n",
		o.PrefillPerToken, o.DecodePerToken, o.KVBytesPerToken, o.KVBandwidth/1e6, o.PrefillSlots, o.Dir)
	fmt.Fprintf(o.Out, "(--prefill-slots %d: an engine computes at most that many prefills at once, the rest queue, as on a compute-bound GPU;\n"+
		" decode steps and KV pulls run beside them)\n", o.PrefillSlots)
	scenarios := []struct {
		n   int
		run func(context.Context, Options, *rig) ([]Line, error)
	}{{1, runSlow}, {2, runCold}, {3, runShort}, {4, runKill}, {5, runLeave}}
	var lines []Line
	for _, s := range scenarios {
		if !slices.Contains(o.Scenarios, s.n) {
			continue
		}
		r := &rig{o: o, dir: filepath.Join(o.Dir, strconv.Itoa(s.n))}
		if err := os.MkdirAll(r.dir, 0o755); err != nil {
			return fmt.Errorf("scenario %d: %w", s.n, err)
		}
		got, err := s.run(ctx, o, r)
		r.stop()
		if err != nil {
			return fmt.Errorf("scenario %d: %w", s.n, err)
		}
		lines = append(lines, got...)
	}
	_, err = writeLines(o.Out, lines)
	return err
}

// rig is one scenario's processes, all stopped when the scenario ends.
type rig struct {
	o     Options
	dir   string
	procs []*benchsuite.Process
}

// stop ends every process still running, the last started first.
func (r *rig) stop() {
	for i := len(r.procs) - 1; i >= 0; i-- {
		r.procs[i].Stop()
	}
	r.procs = nil
}

// kill ends p at once (SIGKILL), as a crash would.
func (r *rig) kill(p *benchsuite.Process) {
	p.Kill()
	r.procs = slices.DeleteFunc(r.procs, func(q *benchsuite.Process) bool { return q == p })
}

// start runs a process of the rig and waits until health answers 200.
func (r *rig) start(ctx context.Context, name, health string, args ...string) (*benchsuite.Process, error) {
	bin := "engine-sim"
	if name[0] == 's' { // sidecars are named s-*, engines e-*
		bin = "pd-sidecar"
	}
	p, err := benchsuite.Start(r.dir, name, filepath.Join(r.o.Bin, bin), args...)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, p)
	if err := benchsuite.WaitHTTP(ctx, health, 20*time.Second); err != nil {
		return nil, fmt.Errorf("%s (log %s): %w", name, filepath.Join(r.dir, name+".log"), err)
	}
	return p, nil
}

// engine is one engine-sim: its ports and process.
type engine struct {
	name                   string
	port, kvPort, bootPort int
	p                      *benchsuite.Process
	args                   []string
}

func (e *engine) url() string      { return "http://" + e.hostPort() }
func (e *engine) hostPort() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.port)) }
func (e *engine) metrics() string  { return e.url() + "/metrics" }

// engine starts an engine-sim named e-name in role with the bench's timing
// and extra flags.
func (r *rig) engine(ctx context.Context, name, role string, extra ...string) (*engine, error) {
	ports, err := benchsuite.FreePorts(3)
	if err != nil {
		return nil, err
	}
	e := &engine{name: "e-" + name, port: ports[0], kvPort: ports[1], bootPort: ports[2]}
	e.args = append([]string{"--role", role, "--port", itoa(e.port), "--kv-port", itoa(e.kvPort), "--bootstrap-port", itoa(e.bootPort),
		"--model", "sim-model", "--log-level", "warn",
		"--prefill-us-per-token", ftoa(float64(r.o.PrefillPerToken) / float64(time.Microsecond)),
		"--decode-us-per-token", ftoa(float64(r.o.DecodePerToken) / float64(time.Microsecond)),
		"--kv-bytes-per-token", itoa(r.o.KVBytesPerToken), "--kv-bandwidth", ftoa(r.o.KVBandwidth),
		"--prefill-slots", itoa(r.o.PrefillSlots), "--default-max-tokens", itoa(r.o.OutputTokens)}, extra...)
	return e, r.restart(ctx, e)
}

// restart starts e again, on the same ports (after a kill).
func (r *rig) restart(ctx context.Context, e *engine) error {
	p, err := r.start(ctx, e.name, e.url()+"/health", e.args...)
	e.p = p
	return err
}

// sidecar is one pd-sidecar in front of a decode engine.
type sidecar struct {
	name string
	port int
}

func (s *sidecar) url() string     { return "http://127.0.0.1:" + itoa(s.port) }
func (s *sidecar) metrics() string { return s.url() + "/metrics" }

// sidecar starts a pd-sidecar named s-name in front of e with extra flags.
func (r *rig) sidecar(ctx context.Context, name string, e *engine, extra ...string) (*sidecar, error) {
	ports, err := benchsuite.FreePorts(1)
	if err != nil {
		return nil, err
	}
	s := &sidecar{name: "s-" + name, port: ports[0]}
	args := append([]string{"--port", itoa(s.port), "--model-server-port", itoa(e.port), "--log-level", "warn"}, extra...)
	_, err = r.start(ctx, s.name, s.url()+"/v1/models", args...)
	return s, err
}

func itoa(i int) string     { return strconv.Itoa(i) }
func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
