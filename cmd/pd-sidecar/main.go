// Command pd-sidecar is the routing sidecar of a prefill/decode
// disaggregated decode pod: it runs the prefill named by the
// x-prefiller-host-port header on that prefill engine, hands the KV to the
// local decode engine and streams the decode back, degrading to a local
// prefill whenever the prefiller fails.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, errHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitUsage
	}
	log := zerolog.New(stdout).Level(opts.logLevel).With().Timestamp().Logger()
	conn, err := connector(opts.connector)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitUsage
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg, opts.cfg.MaxPrefillers)
	p, err := proxy.New(opts.cfg, conn, m, reg, log)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info().Str("kv_connector", conn.Name()).Int("port", opts.cfg.Port).
		Int("model_server_port", opts.cfg.ModelServerPort).Msg("pd-sidecar starting")
	if err := p.Run(ctx); err != nil {
		log.Error().Err(err).Msg("pd-sidecar stopped with an error")
		return exitFailed
	}
	return exitOK
}

// connector returns the connector registered under name: the one place
// where connectors are registered.
func connector(name string) (connectors.Connector, error) {
	switch name {
	case nixlv2.Name:
		return nixlv2.New(), nil
	}
	return nil, fmt.Errorf("--kv-connector %q is not supported (supported: %s)", name, nixlv2.Name)
}
