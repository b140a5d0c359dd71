package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/sidecar"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/transports"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvpull"
)

// kvOptions configure the sidecar-driven KV pull (--kv-connector sidecar).
type kvOptions struct {
	transport     string
	pullTimeout   time.Duration
	streams       int
	skipChecksums bool
	allocLease    time.Duration
	probeInterval time.Duration
}

// addKVFlags declares the KV pull flags on fs.
func addKVFlags(fs *pflag.FlagSet, o *kvOptions) {
	fs.StringVar(&o.transport, "kv-transport", "tcp", "transport of the sidecar's own KV pull (--kv-connector sidecar): "+strings.Join(transports.Names, ", "))
	fs.DurationVar(&o.pullTimeout, "kv-pull-timeout", 10*time.Second, "deadline of one KV pull, open to verified bytes")
	fs.IntVar(&o.streams, "kv-pull-streams", 4, "parallel reads (connections) per KV pull")
	fs.BoolVar(&o.skipChecksums, "kv-skip-checksums", false, "do not verify pulled blocks against the source's CRC-64 checksums (sizes are still verified)")
	fs.DurationVar(&o.allocLease, "kv-alloc-lease", 30*time.Second, "lease of the local blocks borrowed for a pull (the engine frees them if the sidecar vanishes)")
	fs.DurationVar(&o.probeInterval, "kv-probe-interval", 0, "probe recently used prefillers' KV agents this often into pd_sidecar_kv_probe_latency_seconds (0: off)")
}

// validate reports an invalid KV option, as one line.
func (o kvOptions) validate() error {
	switch {
	case !slices.Contains(transports.Names, o.transport):
		return fmt.Errorf("--kv-transport %q is not one of %s", o.transport, strings.Join(transports.Names, ", "))
	case o.pullTimeout <= 0:
		return fmt.Errorf("--kv-pull-timeout must be > 0, got %v", o.pullTimeout)
	case o.streams <= 0 || o.streams > 64:
		return fmt.Errorf("--kv-pull-streams must be within 1..64, got %d", o.streams)
	case o.allocLease <= 0:
		return fmt.Errorf("--kv-alloc-lease must be > 0, got %v", o.allocLease)
	case o.probeInterval < 0:
		return fmt.Errorf("--kv-probe-interval must be >= 0, got %v", o.probeInterval)
	}
	return nil
}

// enableKVPull turns the sidecar pull on when the connector has that
// ability; it builds the transport (a missing ucx build or NIXL library is
// an error here, at startup) and returns the periodic probe to run (nil
// when off) and a close func.
func enableKVPull(p *proxy.Proxy, conn connectors.Connector, o kvOptions, reg prometheus.Registerer, log zerolog.Logger) (func(context.Context), func(), error) {
	if conn.Name() != sidecar.Name {
		return nil, func() {}, nil
	}
	tr, err := transports.NewWith(o.transport, transports.Options{NIXLLibrary: os.Getenv("NIXL_CAPI_LIB")})
	if err != nil {
		return nil, nil, err
	}
	puller, err := kvtransfer.NewPuller(tr, kvtransfer.PullerConfig{
		Streams: o.streams, Deadline: o.pullTimeout, SkipChecksums: o.skipChecksums,
	})
	if err != nil {
		return nil, nil, err
	}
	m := metrics.NewKVPull(reg)
	if err := p.EnableKVPull(kvpull.Config{AllocLease: o.allocLease}, puller, m); err != nil {
		_ = puller.Close()
		return nil, nil, err
	}
	log.Info().Str("kv_transport", tr.Name()).Str("kv_pull_timeout", o.pullTimeout.String()).Int("kv_pull_streams", o.streams).Msg("sidecar KV pull enabled")
	var probe func(context.Context)
	if o.probeInterval > 0 {
		probe = func(ctx context.Context) { p.RunKVProbes(ctx, o.probeInterval) }
	}
	return probe, func() { _ = puller.Close() }, nil
}
