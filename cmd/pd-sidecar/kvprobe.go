package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/transports"
)

// runKVProbe is `pd-sidecar kv-probe`: it measures the latency (bare round
// trips) and the bandwidth (one read of --size filler bytes) to a peer's
// kvtransfer agent over a transport, to validate the fabric from inside a
// pod before deploying.
func runKVProbe(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("pd-sidecar kv-probe", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	peer := fs.String("peer", "", "the agent's host:port (required)")
	transport := fs.String("transport", "tcp", "tcp, ucx or nixl")
	size := fs.String("size", "64MiB", "bytes to read for the bandwidth figure (e.g. 256KiB, 64MiB, 1GiB)")
	count := fs.Int("count", 20, "round trips for the latency figures")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on each measurement")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: pd-sidecar kv-probe --peer HOST:PORT [flags]\n%s", fs.FlagUsages())
			return exitOK
		}
		fmt.Fprintf(stderr, "pd-sidecar kv-probe: %v\n", err)
		return exitUsage
	}
	n, err := parseSize(*size)
	switch {
	case err != nil:
	case *peer == "":
		err = errors.New("--peer is required")
	case *count <= 0:
		err = errors.New("--count must be positive")
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
	res, err := kvProbe(context.Background(), tr, *peer, n, *count, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar kv-probe: %v\n", err)
		return exitFailed
	}
	fmt.Fprintf(stdout, "peer %s transport %s\n", *peer, tr.Name())
	fmt.Fprintf(stdout, "latency over %d round trips: min %v p50 %v max %v\n", *count, res.min, res.p50, res.max)
	fmt.Fprintf(stdout, "bandwidth: %d bytes in %v = %.3f GB/s\n", n, res.took, res.gbps)
	return exitOK
}

type probeResult struct {
	min, p50, max, took time.Duration
	gbps                float64
}

// kvProbe runs count bare round trips and one read of size bytes.
func kvProbe(ctx context.Context, tr kvtransfer.Transport, peer string, size, count int, timeout time.Duration) (probeResult, error) {
	var r probeResult
	p, err := kvtransfer.NewPuller(tr, kvtransfer.PullerConfig{Deadline: timeout})
	if err != nil {
		return r, err
	}
	defer p.Close()
	lat := make([]time.Duration, 0, count)
	for range count {
		d, err := p.Probe(ctx, peer, 0)
		if err != nil {
			return r, err
		}
		lat = append(lat, d)
	}
	slices.Sort(lat)
	r.min, r.p50, r.max = lat[0], lat[len(lat)/2], lat[len(lat)-1]
	if r.took, err = p.Probe(ctx, peer, size); err != nil {
		return r, err
	}
	r.gbps = float64(size) / r.took.Seconds() / 1e9
	return r, nil
}

// parseSize reads 123, 4KiB, 256KiB, 64MiB, 1GiB (also KB/MB/GB as powers
// of 1000).
func parseSize(s string) (int, error) {
	units := []struct {
		suffix string
		mult   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}, {"", 1}}
	for _, u := range units {
		if len(s) < len(u.suffix) || s[len(s)-len(u.suffix):] != u.suffix {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(s[:len(s)-len(u.suffix)], "%d", &n); err != nil || n < 0 || fmt.Sprint(n) != s[:len(s)-len(u.suffix)] {
			break
		}
		if n*u.mult > 1<<30 {
			return 0, fmt.Errorf("--size %s is above 1GiB", s)
		}
		return n * u.mult, nil
	}
	return 0, fmt.Errorf("--size %q is not a size like 256KiB or 64MiB", s)
}
