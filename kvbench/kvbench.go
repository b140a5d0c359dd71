// Package kvbench is `pd-bench kv` (make bench-kv): the KV data plane side
// by side with its ceilings, in one run. For every UCX_TLS setting it runs
// UCX's own ucx_perftest (one-sided ucp_get, two processes) and our pull
// path (engine-sim's kvtransfer agent read by `pd-sidecar kv-probe
// --transport ucx`, two processes) at each block size and prints the ratio;
// then the tcp transport against a raw one-connection copy and iperf3.
package kvbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pd-sidecar/pd-sidecar/bytesize"
)

// Options configure a run.
type Options struct {
	// Bin holds engine-sim and pd-sidecar, both built with -tags ucx.
	Bin string
	// Dir receives the processes' logs.
	Dir string
	// TLS are the UCX_TLS settings to run ("" leaves UCX_TLS unset: UCX's
	// own choice).
	TLS []string
	// Blocks are the block sizes, in bytes.
	Blocks []int
	// Bytes is how much each measurement moves per block size.
	Bytes int
	// Perftest and Iperf are the tools' paths ("" or missing: that column
	// says so).
	Perftest, Iperf string
	// Repeat is how many times each figure is measured; the best counts
	// (this is a ceiling, and a 2-core machine's noise only lowers it).
	Repeat int
	// Out receives the tables.
	Out io.Writer
}

// best runs f Repeat times and keeps the highest figure.
func (o Options) best(f func() Result) Result {
	var b Result
	for range max(1, o.Repeat) {
		r := f()
		if r.GBps > b.GBps || (b.GBps == 0 && b.Note == "") {
			b = r
		}
	}
	return b
}

// Result is one block size's figures on one path, in GB/s (0: not run;
// the note says why).
type Result struct {
	GBps float64
	Note string
}

// Run measures and prints every table.
func Run(ctx context.Context, o Options) error {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "KV data plane, %s blocks, %s per block size and path (GB/s = 1e9 bytes/s), best of %d\n",
		joinSizes(o.Blocks), bytesize.Format(o.Bytes), max(1, o.Repeat))
	fmt.Fprintf(o.Out, "memory copy on one core, a 4MiB source cycled into %s of fresh memory (what every get lands in): %s\n",
		bytesize.Format(o.Bytes), o.best(func() Result { return memCopy(o.Bytes) }).cell())
	fmt.Fprintf(o.Out, "ucx_perftest reads one buffer of the block size into one buffer, again and again (cache-resident up to\n"+
		"about 1MiB here); the sidecar's pull reads distinct blocks into %s of distinct memory, as a pull does\n\n", bytesize.Format(o.Bytes))
	for _, tls := range o.TLS {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := tls
		if name == "" {
			name = "(unset)"
		}
		env := tlsEnv(tls)
		perf := make([]Result, len(o.Blocks))
		for i, bs := range o.Blocks {
			perf[i] = o.best(func() Result { return perftest(ctx, o, env, bs) })
		}
		ours, info, err := probe(ctx, o, "ucx", env)
		same, _, serr := probe(ctx, o, "ucx", env, "--same-buffer")
		var notes notes
		fmt.Fprintf(o.Out, "UCX_TLS=%s   %s\n", name, info)
		fmt.Fprintf(o.Out, "%8s %14s | %-24s | %-24s | %s\n", "", "", "same work as ucx_perftest", "a pull", "")
		fmt.Fprintf(o.Out, "%8s %14s | %-24s | %-24s | %s\n", "", "", "UCX memory, one buffer", "engine memory, distinct", "UCX memory, distinct")
		fmt.Fprintf(o.Out, "%8s %14s | %15s %8s | %15s %8s | %15s\n", "block", "ucx_perftest", "pd-sidecar", "ratio", "pd-sidecar", "ratio", "pd-sidecar")
		for i, bs := range o.Blocks {
			pull, alloc, like := Result{Note: errNote(err)}, Result{Note: errNote(err)}, Result{Note: errNote(serr)}
			if err == nil {
				pull, alloc = ours[bs][0], ours[bs][1]
			}
			if serr == nil {
				like = same[bs][1]
			}
			fmt.Fprintf(o.Out, "%8s %14s | %15s %8s | %15s %8s | %15s\n", bytesize.Format(bs), perf[i].cell(),
				like.cell(), ratio(like, perf[i]), pull.cell(), ratio(pull, perf[i]), alloc.cell())
			notes.add("ucx_perftest", perf[i])
			notes.add("pd-sidecar", pull)
			notes.add("pd-sidecar", like)
		}
		notes.print(o.Out)
		fmt.Fprintln(o.Out)
	}
	var tcpNotes notes
	fmt.Fprintf(o.Out, "tcp transport: a pull in this process (agent, puller, holds; no checksums) against a raw one-connection copy and iperf3 -P 1\n")
	fmt.Fprintf(o.Out, "%8s %14s %14s %12s %12s %10s %10s\n", "block", "pull, 1 conn", "pull, 4 conns", "raw copy", "iperf3", "1 vs raw", "1 vs iperf")
	for _, bs := range o.Blocks {
		one := o.best(func() Result { return tcpPull(ctx, o.Bytes, bs, 1) })
		four := o.best(func() Result { return tcpPull(ctx, o.Bytes, bs, 4) })
		raw := o.best(func() Result { return rawCopy(ctx, o.Bytes, bs) })
		ip := o.best(func() Result { return iperf(ctx, o, bs) })
		fmt.Fprintf(o.Out, "%8s %14s %14s %12s %12s %10s %10s\n", bytesize.Format(bs), one.cell(), four.cell(), raw.cell(), ip.cell(), ratio(one, raw), ratio(one, ip))
		tcpNotes.add("pull", one)
		tcpNotes.add("pull", four)
		tcpNotes.add("raw copy", raw)
		tcpNotes.add("iperf3", ip)
	}
	tcpNotes.print(o.Out)
	return nil
}

// notes collects why cells are empty, once each.
type notes []string

func (n *notes) add(who string, r Result) {
	if r.GBps > 0 || r.Note == "" {
		return
	}
	s := who + ": " + r.Note
	for _, x := range *n {
		if x == s {
			return
		}
	}
	*n = append(*n, s)
}

func (n notes) print(w io.Writer) {
	for _, s := range n {
		fmt.Fprintf(w, "  n/a: %s\n", s)
	}
}

func errNote(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (r Result) cell() string {
	if r.GBps > 0 {
		return fmt.Sprintf("%.2f GB/s", r.GBps)
	}
	if r.Note == "" {
		return "-"
	}
	return "n/a"
}

func ratio(a, b Result) string {
	if a.GBps <= 0 || b.GBps <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a.GBps/b.GBps)
}

// tlsEnv is the environment for one UCX_TLS setting.
func tlsEnv(tls string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "UCX_TLS=") {
			env = append(env, kv)
		}
	}
	if tls != "" {
		env = append(env, "UCX_TLS="+tls)
	}
	return env
}

// perftest runs ucx_perftest's one-sided get bandwidth test at bs: a
// server and a client process with the same environment.
func perftest(ctx context.Context, o Options, env []string, bs int) Result {
	if o.Perftest == "" {
		return Result{Note: "ucx_perftest not found (Debian: ucx-utils)"}
	}
	port, err := freePort()
	if err != nil {
		return Result{Note: err.Error()}
	}
	iters := max(200, o.Bytes/bs)
	args := []string{"-t", "ucp_get", "-s", strconv.Itoa(bs), "-n", strconv.Itoa(iters), "-w", strconv.Itoa(max(20, iters/10)), "-p", strconv.Itoa(port)}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	srv := exec.CommandContext(ctx, o.Perftest, args...)
	srv.Env = env
	var srvOut bytes.Buffer
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	srv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := srv.Start(); err != nil {
		return Result{Note: err.Error()}
	}
	defer func() { _ = syscall.Kill(-srv.Process.Pid, syscall.SIGKILL); _ = srv.Wait() }()
	var out []byte
	for attempt := range 50 { // the server needs a moment to listen
		cli := exec.CommandContext(ctx, o.Perftest, append([]string{"127.0.0.1"}, args...)...)
		cli.Env = env
		out, err = cli.CombinedOutput()
		if err == nil || attempt == 49 || !bytes.Contains(out, []byte("onnection refused")) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = os.WriteFile(filepath.Join(o.Dir, fmt.Sprintf("perftest-%s-%d.log", tlsName(env), bs)), append(out, srvOut.Bytes()...), 0o644)
	if gb, ok := parsePerftest(out); ok {
		return Result{GBps: gb}
	}
	return Result{Note: "ucx_perftest failed: " + lastLine(out)}
}

// parsePerftest reads the overall bandwidth (MB/s, 2^20 bytes) of
// ucx_perftest's "Final:" line, in GB/s.
func parsePerftest(out []byte) (float64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 8 && f[0] == "Final:" {
			mbs, err := strconv.ParseFloat(f[6], 64)
			if err == nil && mbs > 0 {
				return mbs * (1 << 20) / 1e9, true
			}
		}
	}
	return 0, false
}

// probeReport is the part of kv-probe's --json report read here.
type probeReport struct {
	LaneSummary string `json:"lane_summary"`
	UCXVersion  string `json:"ucx_version"`
	Blocks      []struct {
		BlockBytes    int     `json:"block_bytes"`
		GBps          float64 `json:"gb_per_s"`
		UCXMemoryGBps float64 `json:"ucx_memory_gb_per_s"`
	} `json:"blocks"`
}

// probe starts engine-sim's kvtransfer agent over transport and reads it
// with kv-probe, both with env.
func probe(ctx context.Context, o Options, transport string, env []string, extra ...string) (map[int][2]Result, string, error) {
	var best map[int][2]Result
	var info string
	for range max(1, o.Repeat) {
		res, in, err := probeOnce(ctx, o, transport, env, extra)
		if err != nil {
			return nil, "", err
		}
		info = in
		if best == nil {
			best = res
			continue
		}
		for bs, r := range res {
			b := best[bs]
			for k := range r {
				if r[k].GBps > b[k].GBps {
					b[k] = r[k]
				}
			}
			best[bs] = b
		}
	}
	return best, info, nil
}

// probeOnce is one agent and one kv-probe run.
func probeOnce(ctx context.Context, o Options, transport string, env []string, extra []string) (map[int][2]Result, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	httpPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	logf, err := os.Create(filepath.Join(o.Dir, fmt.Sprintf("agent-%s-%s.log", transport, tlsName(env))))
	if err != nil {
		return nil, "", err
	}
	defer logf.Close()
	agent := exec.CommandContext(ctx, filepath.Join(o.Bin, "engine-sim"), "--port", strconv.Itoa(httpPort),
		"--kv-agent-transport", transport, "--kv-agent-port", strconv.Itoa(port))
	agent.Env = env
	agent.Stdout, agent.Stderr = logf, logf
	if err := agent.Start(); err != nil {
		return nil, "", err
	}
	defer func() { _ = agent.Process.Kill(); _ = agent.Wait() }()
	if err := waitTCP(ctx, port, 10*time.Second); err != nil {
		return nil, "", fmt.Errorf("agent: %w", err)
	}
	sizes := make([]string, len(o.Blocks))
	for i, bs := range o.Blocks {
		sizes[i] = strconv.Itoa(bs)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(o.Bin, "pd-sidecar"), "kv-probe", "--json", "--transport", transport,
		"--peer", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), "--block-sizes", strings.Join(sizes, ","),
		"--size", strconv.Itoa(o.Bytes), "--count", "20")
	cmd.Args = append(cmd.Args, extra...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, "", fmt.Errorf("kv-probe: %w: %s", err, lastLine(stderr.Bytes()))
	}
	var rep probeReport
	if err := json.Unmarshal(out, &rep); err != nil {
		return nil, "", fmt.Errorf("kv-probe output: %w", err)
	}
	res := map[int][2]Result{}
	for _, b := range rep.Blocks {
		res[b.BlockBytes] = [2]Result{{GBps: b.GBps}, {GBps: b.UCXMemoryGBps}}
	}
	info := ""
	if rep.LaneSummary != "" {
		info = "UCX " + rep.UCXVersion + ", lanes: " + rep.LaneSummary
	}
	return res, info, nil
}

// memCopy copies total bytes from a 4 MiB source, cycled, into total bytes
// of distinct memory: the ceiling of any read landing in fresh memory.
func memCopy(total int) Result {
	src := make([]byte, 4<<20)
	for i := range src {
		src[i] = byte(i)
	}
	dst := make([]byte, total)
	for off := 0; off < total; off += len(src) { // fault the pages in first
		dst[off] = 1
	}
	start := time.Now()
	for off := 0; off < total; off += len(src) {
		copy(dst[off:], src)
	}
	return Result{GBps: float64(total) / time.Since(start).Seconds() / 1e9}
}

// rawCopy copies total bytes over one loopback TCP connection in writes of
// bs from distinct memory into one buffer: the ceiling of a one-connection
// pull.
func rawCopy(ctx context.Context, total, bs int) Result {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Result{Note: err.Error()}
	}
	defer l.Close()
	src := make([]byte, total)
	for i := range src {
		src[i] = byte(i)
	}
	errc := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		for off := 0; off < total; off += bs {
			if _, err := c.Write(src[off:min(total, off+bs)]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", l.Addr().String())
	if err != nil {
		return Result{Note: err.Error()}
	}
	defer c.Close()
	dst := make([]byte, total)
	start := time.Now()
	if _, err := io.ReadFull(c, dst); err != nil {
		return Result{Note: err.Error()}
	}
	took := time.Since(start)
	if err := <-errc; err != nil {
		return Result{Note: err.Error()}
	}
	return Result{GBps: float64(total) / took.Seconds() / 1e9}
}

// iperfMaxWrite is iperf3's largest write (-l); larger blocks are written
// in pieces of it.
const iperfMaxWrite = 1 << 20

// iperf runs iperf3's one-stream loopback test moving total bytes in
// writes of bs.
func iperf(ctx context.Context, o Options, bs int) Result {
	if o.Iperf == "" {
		return Result{Note: "iperf3 not found"}
	}
	port, err := freePort()
	if err != nil {
		return Result{Note: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	srv := exec.CommandContext(ctx, o.Iperf, "-s", "-1", "-p", strconv.Itoa(port))
	if err := srv.Start(); err != nil {
		return Result{Note: err.Error()}
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	// No readiness check: a connection to the one-off server would use
	// it up. The client retries while the server is not listening yet.
	var out []byte
	for attempt := range 50 {
		out, err = exec.CommandContext(ctx, o.Iperf, "-c", "127.0.0.1", "-p", strconv.Itoa(port), "-P", "1",
			"-n", strconv.Itoa(max(o.Bytes, 4*bs)), "-l", strconv.Itoa(min(bs, iperfMaxWrite)), "-J").Output()
		if attempt == 49 || !bytes.Contains(out, []byte("unable to connect")) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var rep struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if jerr := json.Unmarshal(out, &rep); jerr != nil || rep.End.SumReceived.BitsPerSecond <= 0 {
		return Result{Note: fmt.Sprintf("iperf3: no result (%v %s)", err, rep.Error)}
	}
	return Result{GBps: rep.End.SumReceived.BitsPerSecond / 8 / 1e9}
}

func waitTCP(ctx context.Context, port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %s after %v: %w", addr, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tlsName(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "UCX_TLS="); ok {
			return strings.ReplaceAll(v, ",", "+")
		}
	}
	return "unset"
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

func joinSizes(s []int) string {
	out := make([]string, len(s))
	for i, n := range s {
		out[i] = bytesize.Format(n)
	}
	return strings.Join(out, ", ")
}
