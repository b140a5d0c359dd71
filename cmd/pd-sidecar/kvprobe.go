package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/bytesize"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/transports"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/ucx"
)

// runKVProbe is `pd-sidecar kv-probe`: it measures, for each block size,
// the latency of one-block reads (percentiles) and the bandwidth of many
// blocks read as a pull reads them, from a peer's kvtransfer agent over a
// transport; it says which UCX transports carried the reads and whether the
// result is what the transport should reach. It validates the fabric from
// inside a pod before deploying.
func runKVProbe(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("pd-sidecar kv-probe", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	peer := fs.String("peer", "", "the agent's host:port (required)")
	transport := fs.String("transport", "tcp", "tcp, ucx or nixl")
	sizes := fs.String("block-sizes", "4KiB,64KiB,256KiB,1MiB,4MiB", "block sizes to measure, comma-separated")
	size := fs.String("size", "64MiB", "bytes read for each block size's bandwidth figure (at most 1GiB)")
	count := fs.Int("count", 50, "one-block reads for each block size's latency percentiles")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on each measurement")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	sameBuffer := fs.Bool("same-buffer", false, "read every block of a bandwidth figure into one buffer, as ucx_perftest does (cache-resident at small blocks), instead of into distinct memory as a pull does")
	readFor := fs.Duration("read-for", 0, "repeat each block size's bandwidth read of --size until at least this long has passed (0: read it once)")
	progress := fs.Bool("progress", false, "print a line to stderr as each bandwidth read starts")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: pd-sidecar kv-probe --peer HOST:PORT [flags]\n%s", fs.FlagUsages())
			return exitOK
		}
		fmt.Fprintf(stderr, "pd-sidecar kv-probe: %v\n", err)
		return exitUsage
	}
	total, err := bytesize.Parse(*size)
	if err != nil {
		err = fmt.Errorf("--size: %w", err)
	}
	var blocks []int
	if err == nil {
		if blocks, err = bytesize.ParseList(*sizes); err != nil {
			err = fmt.Errorf("--block-sizes: %w", err)
		}
	}
	switch {
	case err != nil:
	case *peer == "":
		err = errors.New("--peer is required")
	case *count <= 0:
		err = errors.New("--count must be positive")
	case *readFor < 0:
		err = errors.New("--read-for must not be negative")
	}
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar kv-probe: %v\n", err)
		return exitUsage
	}
	tr, err := transports.NewWith(*transport, transports.Options{NIXLLibrary: os.Getenv("NIXL_CAPI_LIB")})
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar kv-probe: %v\n", err)
		return exitUsage
	}
	opt := probeOptions{timeout: *timeout, sameBuffer: *sameBuffer, readFor: *readFor}
	if *progress {
		opt.progress = stderr
	}
	rep, err := kvProbe(context.Background(), tr, *peer, blocks, total, *count, opt)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar kv-probe: %v\n", err)
		return exitFailed
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		rep.print(stdout)
	}
	return exitOK
}

// probeReport is kv-probe's result (its --json form is read by pd-bench kv).
type probeReport struct {
	Peer      string `json:"peer"`
	Transport string `json:"transport"`
	// UCXVersion, Lanes and PeerFailureDetection describe ucx endpoints.
	UCXVersion           string `json:"ucx_version,omitempty"`
	Lanes                string `json:"lanes,omitempty"`
	LaneSummary          string `json:"lane_summary,omitempty"`
	PeerFailureDetection *bool  `json:"peer_failure_detection,omitempty"`
	// RoundTrip is the transport's smallest round trip (p50).
	RoundTrip time.Duration `json:"round_trip_ns"`
	// SameBuffer: every block of a bandwidth figure landed in one buffer.
	SameBuffer bool          `json:"same_buffer,omitempty"`
	Blocks     []blockResult `json:"blocks"`
	Verdict    string        `json:"verdict"`
}

// blockResult is one block size's figures.
type blockResult struct {
	BlockBytes int           `json:"block_bytes"`
	P50        time.Duration `json:"p50_ns"`
	P90        time.Duration `json:"p90_ns"`
	P99        time.Duration `json:"p99_ns"`
	Max        time.Duration `json:"max_ns"`
	Bytes      int           `json:"bytes"`
	Took       time.Duration `json:"took_ns"`
	GBps       float64       `json:"gb_per_s"`
	// UCXMemoryGBps is the bandwidth from memory UCX allocated on the agent
	// (ucx only): what ucx_perftest measures.
	UCXMemoryGBps float64 `json:"ucx_memory_gb_per_s,omitempty"`
}

// lanesReporter is the ucx connection's description of its endpoint.
type lanesReporter interface {
	Lanes(ctx context.Context) (string, error)
	PeerFailureDetection() bool
}

// ucxMemoryProber is the ucx connection's probe of memory UCX allocated.
type ucxMemoryProber interface {
	ProbeUCXMemory(ctx context.Context, dst [][]byte) error
}

// probeOptions are kv-probe's settings beside what it measures.
type probeOptions struct {
	// timeout bounds each measurement.
	timeout time.Duration
	// sameBuffer reads every block of a bandwidth figure into one buffer.
	sameBuffer bool
	// readFor repeats each bandwidth read until at least this long has
	// passed (0: one read).
	readFor time.Duration
	// progress, when set, gets a line as each bandwidth read starts.
	progress io.Writer
}

// kvProbe measures every block size: count one-block reads (after one to
// warm up) and one read of total bytes in blocks of that size (repeated
// until opt.readFor has passed).
func kvProbe(ctx context.Context, tr kvtransfer.Transport, peer string, blocks []int, total, count int, opt probeOptions) (probeReport, error) {
	timeout, sameBuffer := opt.timeout, opt.sameBuffer
	rep := probeReport{Peer: peer, Transport: tr.Name(), SameBuffer: sameBuffer}
	p, err := kvtransfer.NewPuller(tr, kvtransfer.PullerConfig{Deadline: timeout})
	if err != nil {
		return rep, err
	}
	defer p.Close()
	rtt := make([]time.Duration, 0, count)
	for range count + 1 {
		d, err := p.Probe(ctx, peer, nil)
		if err != nil {
			return rep, err
		}
		rtt = append(rtt, d)
	}
	slices.Sort(rtt[1:])
	rep.RoundTrip = rtt[1+count/2]
	var ump ucxMemoryProber
	if c, err := p.Conn(ctx, peer); err == nil {
		ump, _ = c.(ucxMemoryProber)
		if lr, ok := c.(lanesReporter); ok {
			rep.UCXVersion = ucx.Version()
			if rep.Lanes, err = lr.Lanes(ctx); err != nil {
				return rep, err
			}
			rep.LaneSummary = summarizeLanes(rep.Lanes)
			pfd := lr.PeerFailureDetection()
			rep.PeerFailureDetection = &pfd
		}
	}
	// The destination is mapped memory, as an engine's KV region is (Go's
	// heap read 10-20 % slower at 1-4 MiB blocks here).
	dstRegion, err := kvtransfer.NewMemRegion("kv-probe", 1, max(total, slices.Max(blocks)))
	if err != nil {
		return rep, err
	}
	defer dstRegion.Close()
	buf := dstRegion.Mem()
	for _, bs := range blocks {
		r := blockResult{BlockBytes: bs}
		lat := make([]time.Duration, 0, count)
		one := [][]byte{buf[:bs]}
		for i := range count + 1 {
			d, err := p.Probe(ctx, peer, one)
			if err != nil {
				return rep, fmt.Errorf("%d-byte blocks: %w", bs, err)
			}
			if i > 0 {
				lat = append(lat, d)
			}
		}
		slices.Sort(lat)
		pct := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
		r.P50, r.P90, r.P99, r.Max = pct(0.5), pct(0.9), pct(0.99), lat[len(lat)-1]
		n := max(1, total/bs)
		dst := make([][]byte, n)
		for i := range dst {
			dst[i] = buf[i*bs:][:bs]
			if sameBuffer {
				dst[i] = buf[:bs]
			}
		}
		for pass := 1; pass == 1 || r.Took < opt.readFor; pass++ {
			if opt.progress != nil {
				fmt.Fprintf(opt.progress, "kv-probe: bandwidth read %d of %s blocks started (pass %d)\n", n*bs, bytesize.Format(bs), pass)
			}
			took, err := p.Probe(ctx, peer, dst)
			if err != nil {
				return rep, fmt.Errorf("%d-byte blocks: %w", bs, err)
			}
			r.Took += took
			r.Bytes += n * bs
		}
		r.GBps = float64(r.Bytes) / r.Took.Seconds() / 1e9
		if ump != nil {
			pctx, cancel := context.WithTimeout(ctx, timeout)
			start := time.Now()
			err := ump.ProbeUCXMemory(pctx, dst)
			cancel()
			if err != nil {
				return rep, fmt.Errorf("%d-byte blocks from UCX-allocated memory: %w", bs, err)
			}
			r.UCXMemoryGBps = float64(n*bs) / time.Since(start).Seconds() / 1e9
		}
		rep.Blocks = append(rep.Blocks, r)
	}
	rep.Verdict = verdict(rep)
	return rep, nil
}

func (r probeReport) print(w io.Writer) {
	fmt.Fprintf(w, "peer %s transport %s\n", r.Peer, r.Transport)
	if r.Lanes != "" {
		fmt.Fprintf(w, "ucx %s lanes: %s\n", r.UCXVersion, r.LaneSummary)
		if r.PeerFailureDetection != nil && !*r.PeerFailureDetection {
			fmt.Fprintln(w, "ucx peer failure detection: off on these transports (the control connection and the pull deadline watch the agent)")
		}
	}
	fmt.Fprintf(w, "round trip p50 %v\n", r.RoundTrip)
	fmt.Fprintf(w, "%10s %10s %10s %10s %10s %14s", "block", "p50", "p90", "p99", "max", "bandwidth")
	if r.Lanes != "" {
		fmt.Fprintf(w, " %22s", "from UCX-allocated mem")
	}
	fmt.Fprintln(w)
	for _, b := range r.Blocks {
		fmt.Fprintf(w, "%10s %10v %10v %10v %10v %9.3f GB/s", bytesize.Format(b.BlockBytes), b.P50, b.P90, b.P99, b.Max, b.GBps)
		if r.Lanes != "" {
			fmt.Fprintf(w, " %17.3f GB/s", b.UCXMemoryGBps)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "verdict: %s\n", r.Verdict)
}

// summarizeLanes turns ucp_ep_print_info's text into "tcp/lo (am
// keepalive wireup); ..." and marks the lanes UCX 1.13 lists for gets
// ("get"; 1.19 names rma_bw lanes only). Whether a shared-memory lane
// reads the remote memory itself depends on who allocated that memory,
// which the text does not say: kv-probe's two probe regions show it.
func summarizeLanes(info string) string {
	type lane struct{ tl, roles string }
	var lanes []lane
	gets := map[string]bool{}
	for line := range strings.Lines(info) {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		switch {
		case len(f) >= 2 && strings.HasPrefix(f[0], "lane["):
			tl := f[1]
			if i := strings.IndexByte(tl, ':'); i >= 0 {
				tl = tl[i+1:]
			}
			tl = strings.TrimSuffix(tl, ".0")
			var roles []string
			for _, x := range f[2:] {
				if x == "am" || x == "keepalive" || x == "wireup" || strings.HasPrefix(x, "rma") {
					roles = append(roles, x)
				}
			}
			lanes = append(lanes, lane{tl: tl, roles: strings.Join(roles, " ")})
		case len(f) >= 1 && strings.HasPrefix(f[0], "get["):
			gets[strings.TrimSuffix(strings.TrimPrefix(f[0], "get["), "]:")] = true
		}
	}
	parts := make([]string, 0, len(lanes))
	tcpOnly := true
	for i, l := range lanes {
		roles := l.roles
		if gets[fmt.Sprint(i)] {
			roles = strings.TrimSpace(roles + " get")
		}
		tcpOnly = tcpOnly && strings.HasPrefix(l.tl, "tcp/")
		if roles == "" {
			parts = append(parts, l.tl)
			continue
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", l.tl, roles))
	}
	if len(parts) == 0 {
		return "unknown"
	}
	if tcpOnly {
		parts = append(parts, "tcp cannot read remote memory: gets are emulated in software over the am lane")
	}
	return strings.Join(parts, "; ")
}

// verdict compares the largest block's bandwidth with what the transport
// should reach, and says what to change when it is the transport's limit.
func verdict(r probeReport) string {
	if len(r.Blocks) == 0 {
		return "no measurement"
	}
	best := r.Blocks[len(r.Blocks)-1]
	got := fmt.Sprintf("%.2f GB/s at %s blocks", best.GBps, bytesize.Format(best.BlockBytes))
	switch r.Transport {
	case "tcp":
		return "tcp: " + got + "; expect what one TCP connection carries per stream (iperf3 -P 1 between the pods), times --kv-pull-streams up to the link's rate"
	case "ucx":
		s := r.LaneSummary
		switch {
		case strings.Contains(s, "rc_") || strings.Contains(s, "dc_") || strings.Contains(s, "ud_"):
			return "ucx over RDMA verbs: " + got + "; expect near the NIC's line rate (12 GB/s at 100 Gb/s) with blocks of 64 KiB and up; far below it, check UCX_NET_DEVICES and the NIC's link"
		case strings.Contains(s, "cuda") || strings.Contains(s, "gdr"):
			return "ucx with CUDA transports: " + got
		case strings.Contains(s, "cma/memory (rma") || strings.Contains(s, "xpmem"):
			return "ucx over shared memory (same host): " + got + "; gets read the agent's memory in one copy (cma or xpmem): expect a large part of one core's memory copy rate; across hosts UCX_TLS must include rc or tcp"
		case strings.Contains(s, "sysv") || strings.Contains(s, "posix"):
			return "ucx over sysv/posix shared memory (same host): " + got + "; UCX " + r.UCXVersion + " maps only memory it allocated itself, so the agent's worker serves gets of the engine's KV in software over shared-memory messages (two copies and the agent's CPU: expect about half of one core's memory copy rate); cma is not used here, it aborts the reader when the agent dies unless peer failure is handled, which sysv and posix cannot; across hosts UCX_TLS must include rc or tcp"
		case strings.Contains(s, "tcp"):
			return "ucx over tcp: " + got + "; RMA is emulated in software over TCP, expect ~0.2-1 GB/s (0.2 with one get in flight); set UCX_TLS to include rc (RDMA) or, on one host, sm"
		}
		return "ucx: " + got + "; transports: " + s
	case "nixl":
		return "nixl: " + got + "; NIXL's UCX backend picks its transports from UCX_TLS among those with peer error handling: on one host tcp (RMA emulated in software, ~1 GB/s), across hosts with an RDMA NIC rc (near line rate); every read registers its destination with NIXL first, as a pull does"
	}
	return r.Transport + ": " + got
}
