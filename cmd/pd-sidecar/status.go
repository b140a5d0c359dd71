package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/status"
)

// runStatus is `pd-sidecar status --url http://host:port`: it reads the
// sidecar's /debug/pd and prints whether P/D disaggregation is operating.
// It exits 0 when the sidecar answered, whatever the verdict.
func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("pd-sidecar status", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	url := fs.String("url", "http://127.0.0.1:8000", "base URL of the sidecar (its /debug/pd is read)")
	asJSON := fs.Bool("json", false, "print the raw JSON snapshot")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on the request")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: pd-sidecar status [--url URL] [--json]\n%s", fs.FlagUsages())
			return exitOK
		}
		fmt.Fprintf(stderr, "pd-sidecar status: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	s, err := status.Fetch(ctx, nil, *url)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar %v\n", err)
		return exitFailed
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(s)
	} else {
		err = s.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar status: %v\n", err)
		return exitFailed
	}
	return exitOK
}
