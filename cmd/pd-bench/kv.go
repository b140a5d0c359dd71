package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/bytesize"
	"github.com/pd-sidecar/pd-sidecar/kvbench"
)

// runKV is `pd-bench kv`, the engine of `make bench-kv`.
func runKV(args []string) error {
	o := kvbench.Options{Out: os.Stdout}
	fs := pflag.NewFlagSet("pd-bench kv", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&o.Bin, "bin", "bin", "directory holding engine-sim and pd-sidecar built with -tags ucx")
	fs.StringVar(&o.Dir, "dir", "out/bench-kv", "directory for the processes' logs")
	tls := fs.String("ucx-tls", "unset;sm,self;posix,self;sysv,self;tcp;sm,tcp,self",
		`UCX_TLS settings to run, ";"-separated ("unset": UCX's own choice)`)
	blocks := fs.StringSlice("block-sizes", []string{"4KiB", "64KiB", "256KiB", "1MiB", "4MiB"}, "block sizes")
	size := fs.String("size", "64MiB", "bytes moved per block size and path")
	perftest := fs.String("ucx-perftest", "ucx_perftest", "ucx_perftest binary (Debian: ucx-utils)")
	iperf := fs.String("iperf3", "iperf3", "iperf3 binary")
	fs.IntVar(&o.Repeat, "repeat", 3, "measure every figure this many times and keep the best")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	var err error
	if o.Bytes, err = bytesize.Parse(*size); err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if o.Bytes == 0 {
		return errors.New("--size must be positive")
	}
	if o.Blocks, err = bytesize.ParseList(strings.Join(*blocks, ",")); err != nil {
		return fmt.Errorf("--block-sizes: %w", err)
	}
	for one := range strings.SplitSeq(*tls, ";") {
		if one == "unset" {
			one = ""
		}
		o.TLS = append(o.TLS, one)
	}
	o.Perftest, _ = exec.LookPath(*perftest)
	o.Iperf, _ = exec.LookPath(*iperf)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return kvbench.Run(ctx, o)
}
