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
	"github.com/pd-sidecar/pd-sidecar/connectors/mooncake"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/connectors/offloading"
	"github.com/pd-sidecar/pd-sidecar/connectors/sglang"
	"github.com/pd-sidecar/pd-sidecar/connectors/sharedstorage"
	"github.com/pd-sidecar/pd-sidecar/connectors/sidecar"
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
	if len(args) > 0 && args[0] == "status" {
		return runStatus(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "kv-probe" {
		return runKVProbe(args[1:], stdout, stderr)
	}
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version" || args[0] == "version") {
		fmt.Fprintln(stdout, readBuildInfo())
		return exitOK
	}
	opts, err := parseFlags(args, stdout)
	if errors.Is(err, errHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitUsage
	}
	tracing, err := decideTracing(opts.tracing, os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitUsage
	}
	log := zerolog.New(stdout).Level(opts.logLevel).With().Timestamp().Logger()
	tracing.log(log)
	conn, err := connector(opts.connector, opts.connectorOpts)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitUsage
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	stopWatch, err := startPoolWatch(&opts, reg, log)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitFailed
	}
	defer stopWatch()
	m := metrics.New(reg, opts.cfg.MaxPrefillers)
	bi := readBuildInfo()
	metrics.RegisterBuildInfo(reg, bi.version, bi.revision, bi.goVersion)
	p, err := proxy.New(opts.cfg, conn, m, reg, log)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitUsage
	}
	flush, err := installExtras(p, opts, conn.Name(), tracing, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitUsage
	}
	defer flush()
	probe, closeKV, err := enableKVPull(p, conn, opts.kv, reg, log)
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitUsage
	}
	defer closeKV()
	if w := opts.guard.watcher; w != nil && opts.cfg.PrefillPrewarm {
		watchPrefillers(w, p) // prewarm.go
	}
	if opts.cfg.PrefillPrewarm && opts.guard.ssrf {
		for _, hp := range staticPrefillers(opts.guard.allowlist) {
			p.NotePrefiller(hp)
		}
	}
	stopProfile, err := startDebugProfile(os.Getenv(debugProfileEnv), opts.cfg.Port) // debugprofile.go
	if err != nil {
		fmt.Fprintf(stderr, "pd-sidecar: %v\n", err)
		return exitUsage
	}
	defer stopProfile()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if probe != nil {
		go probe(ctx)
	}
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
func connector(name string, o connectorOptions) (connectors.Connector, error) {
	switch name {
	case nixlv2.Name:
		return nixlv2.New(), nil
	case sglang.Name:
		return sglang.New(o.sglangBootstrapPort), nil
	case mooncake.Name:
		return mooncake.New(o.mooncakeBootstrapPort), nil
	case sharedstorage.Name:
		return sharedstorage.New(), nil
	case offloading.Name:
		return offloading.New(), nil
	case sidecar.Name:
		return sidecar.New(), nil
	}
	return nil, fmt.Errorf("--kv-connector %q is not supported (supported: %s)", name, connectorNames)
}
