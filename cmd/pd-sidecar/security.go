package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// guardOptions are the flags of the request guards: SSRF protection, TLS,
// limits and the circuit breaker.
type guardOptions struct {
	ssrf        bool
	pool        string
	poolGroup   string
	allowlist   []string
	enableTLS   []string
	skipVerify  []string
	kubeconfig  string
	syncTimeout time.Duration
	static      *ssrf.Static
	watcher     *ssrf.PoolWatcher // the running --inference-pool watch (startPoolWatch); nil: none
	maxBuffered int64             // 0: derived (bufferBudget)
	// readFile reads the cgroup's memory limit (os.ReadFile; a test's fake).
	readFile func(string) ([]byte, error)
	// legacyTLS: llm-d's booleans removed in 0.10 (--prefiller-use-tls,
	// --decoder-use-tls, --*-tls-insecure-skip-verify), still accepted
	// with their old meaning.
	legacyTLS struct{ prefiller, decoder, skipPrefiller, skipDecoder bool }
}

// addGuardFlags declares the guard flags on fs, writing into o. The
// INFERENCE_POOL environment variable is --inference-pool's default, as in
// llm-d.
func addGuardFlags(fs *pflag.FlagSet, o *options) {
	g, c := &o.guard, &o.cfg.Guard
	fs.BoolVar(&c.TLS.SecureProxy, "secure-proxy", c.TLS.SecureProxy, "serve the proxy ports over TLS (llm-d defaults to true; pd-sidecar to false)")
	fs.StringVar(&c.TLS.CertPath, "cert-path", c.TLS.CertPath, "directory with tls.crt and tls.key for --secure-proxy, reloaded when they change (empty: self-signed)")
	fs.StringSliceVar(&g.enableTLS, "enable-tls", nil, "upstream legs that use TLS: prefiller, decoder, encoder")
	fs.StringSliceVar(&g.skipVerify, "tls-insecure-skip-verify", nil, "upstream legs whose certificate is not verified: prefiller, decoder, encoder")
	for _, f := range []struct {
		name, use string
		dst       *bool
	}{
		{"prefiller-use-tls", "enable-tls=prefiller", &g.legacyTLS.prefiller},
		{"decoder-use-tls", "enable-tls=decoder", &g.legacyTLS.decoder},
		{"prefiller-tls-insecure-skip-verify", "tls-insecure-skip-verify=prefiller", &g.legacyTLS.skipPrefiller},
		{"decoder-tls-insecure-skip-verify", "tls-insecure-skip-verify=decoder", &g.legacyTLS.skipDecoder},
	} {
		fs.BoolVar(f.dst, f.name, false, "removed in llm-d 0.10: --"+f.use)
		_ = fs.MarkDeprecated(f.name, "use --"+f.use)
	}
	fs.StringVar(&c.TLS.CAFile, "tls-ca-file", c.TLS.CAFile, "PEM bundle of CAs trusted on upstream TLS legs (empty: system pool)")
	fs.BoolVar(&g.ssrf, "enable-ssrf-protection", false, "contact only allowlisted prefillers: Ready pods of --inference-pool on its target ports, and --prefiller-allowlist")
	fs.StringVar(&g.pool, "inference-pool", os.Getenv("INFERENCE_POOL"), "InferencePool namespace/name (a bare name: namespace default) whose Ready pods are the prefiller allowlist (env INFERENCE_POOL)")
	fs.StringVar(&g.poolGroup, "pool-group", ssrf.GroupV1, "InferencePool API group: "+ssrf.GroupV1+" (v1) or "+ssrf.GroupV1Alpha2+" (v1alpha2)")
	fs.StringSliceVar(&g.allowlist, "prefiller-allowlist", nil, "static prefiller allowlist: CIDRs, ip:port, host:port, *.suffix:port (port * = any)")
	fs.BoolVar(&c.TrustClientKVParams, "trust-client-kv-params", c.TrustClientKVParams, "keep the client's own kv_transfer_params, ec_transfer_params, bootstrap_* fields in bodies sent to engines (else removed); with --enable-ssrf-protection the addresses they name must be allowlisted (403); and pass the engines' kv_transfer_params on to the client (else written as null)")
	fs.Var(unknownMembersFlag{&c.RefuseUnknownKVMembers}, "kv-params-unknown-members", "what a prefill answer's kv_transfer_params member the connector does not document does: pass (on to the decode engine unchanged, counted, when it names no address; one that could is always refused) or refuse (a local prefill, invalid_kv_params)")
	fs.StringVar(&g.kubeconfig, "kubeconfig", "", "kubeconfig for the pool watcher outside a cluster (empty: in-cluster config)")
	fs.DurationVar(&g.syncTimeout, "ssrf-sync-timeout", time.Minute, "how long start-up waits for the InferencePool watch to sync")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", c.MaxHeaderBytes, "largest accepted request head (431 above)")
	fs.DurationVar(&c.ReadTimeout, "read-timeout", c.ReadTimeout, "bound on reading a request's head and body (408 above)")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "keep-alive connections idle this long are closed")
	fs.IntVar(&c.MaxConcurrentRequests, "max-concurrent-requests", c.MaxConcurrentRequests, "inference requests in flight, streams included (503 above; 0: unbounded)")
	fs.Int64Var(&g.maxBuffered, "max-buffered-bytes", 0, "bound on the request bodies and upstream answers read whole that are buffered at once, all connections together (503 past it, before the bytes are read; a prefill answer past it falls back, buffered_bytes); 0: a quarter of the container's memory limit (cgroup v2 memory.max), at most 512 MiB and at least --max-request-body-bytes")
	fs.IntVar(&c.Breaker.Failures, "circuit-breaker-failures", c.Breaker.Failures, "consecutive prefill failures that open a prefiller's circuit (0: no breaker)")
	fs.DurationVar(&c.Breaker.Cooldown, "circuit-breaker-cooldown", c.Breaker.Cooldown, "how long an open circuit skips its prefiller before a probe")
	fs.DurationVar(&c.Breaker.ProbeInterval, "circuit-probe-interval", c.Breaker.ProbeInterval, "how often a prefiller whose circuit opened on refused connections is probed with a TCP connect; one that accepts gets the next request as the half-open probe, without waiting for the cooldown (0: no probing)")
}

// apply validates the guard flags and writes what they mean into c.
func (g *guardOptions) apply(c *proxy.Config) error {
	legs := func(flag string, v []string) (pre, dec, enc bool, err error) {
		for _, l := range v {
			switch strings.TrimSpace(l) {
			case "prefiller":
				pre = true
			case "decoder":
				dec = true
			case "encoder":
				enc = true
			case "":
			default:
				return false, false, false, fmt.Errorf("--%s %q: legs are prefiller, decoder, encoder", flag, l)
			}
		}
		return pre, dec, enc, nil
	}
	var err error
	t := &c.Guard.TLS
	if t.Prefiller, t.Decoder, c.Encoder.TLS, err = legs("enable-tls", g.enableTLS); err != nil {
		return err
	}
	if t.InsecureSkipVerifyPrefiller, t.InsecureSkipVerifyDecoder, c.Encoder.InsecureSkipVerify, err = legs("tls-insecure-skip-verify", g.skipVerify); err != nil {
		return err
	}
	l := g.legacyTLS
	t.Prefiller = t.Prefiller || l.prefiller
	t.Decoder = t.Decoder || l.decoder
	t.InsecureSkipVerifyPrefiller = t.InsecureSkipVerifyPrefiller || l.skipPrefiller
	t.InsecureSkipVerifyDecoder = t.InsecureSkipVerifyDecoder || l.skipDecoder
	if g.static, err = ssrf.ParseStatic(g.allowlist); err != nil {
		return err
	}
	if g.poolGroup != ssrf.GroupV1 && g.poolGroup != ssrf.GroupV1Alpha2 {
		return fmt.Errorf("--pool-group %q is not %s or %s", g.poolGroup, ssrf.GroupV1, ssrf.GroupV1Alpha2)
	}
	if g.pool != "" {
		if _, err := ssrf.ParsePool(g.pool, g.poolGroup); err != nil {
			return err
		}
	}
	switch {
	case !g.ssrf && len(g.allowlist) > 0:
		return errors.New("--prefiller-allowlist needs --enable-ssrf-protection")
	case g.ssrf && g.pool == "" && g.static.Len() == 0:
		return errors.New("--enable-ssrf-protection needs --inference-pool (or INFERENCE_POOL) or --prefiller-allowlist")
	case g.syncTimeout <= 0:
		return fmt.Errorf("--ssrf-sync-timeout must be > 0, got %v", g.syncTimeout)
	}
	if g.ssrf && g.pool == "" {
		c.Guard.Allowlist = g.static
	}
	switch {
	case g.maxBuffered < 0:
		return fmt.Errorf("--max-buffered-bytes must be >= 0, got %d", g.maxBuffered)
	case g.maxBuffered > 0:
		c.Guard.MaxBufferedBytes = g.maxBuffered
	default:
		read := g.readFile
		if read == nil {
			read = os.ReadFile
		}
		c.Guard.MaxBufferedBytes = bufferBudget(read, c.MaxRequestBodyBytes)
	}
	return nil
}

// cgroupMemoryMax is the cgroup v2 memory limit of the container.
const cgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// bufferBudget is --max-buffered-bytes when not given: a quarter of the
// container's memory limit (the Go heap may grow to twice its live bytes
// before a collection, and the rest of the sidecar needs room too), at
// most guard.DefaultMaxBufferedBytes, and at least maxBody, so that a body
// of the largest accepted size can still be read. Without a limit (none
// set, "max", cgroup v1 or not Linux) it is DefaultMaxBufferedBytes.
func bufferBudget(read func(string) ([]byte, error), maxBody int) int64 {
	b := int64(guard.DefaultMaxBufferedBytes)
	if raw, err := read(cgroupMemoryMax); err == nil {
		if limit, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64); err == nil && limit > 0 {
			b = min(b, limit/4)
		}
	}
	return max(b, int64(maxBody))
}

// startPoolWatch starts the InferencePool watch when SSRF protection names
// a pool (its collectors registered on reg), waits for its first sync, and
// installs the allowlist in c. The returned func stops the watch.
func startPoolWatch(o *options, reg prometheus.Registerer, log zerolog.Logger) (func(), error) {
	g := &o.guard
	if !g.ssrf || g.pool == "" {
		return func() {}, nil
	}
	pc, err := ssrf.ParsePool(g.pool, g.poolGroup)
	if err != nil {
		return nil, err
	}
	rc, err := kubeConfig(g.kubeconfig)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	az, err := authorizationv1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes authorization client: %w", err)
	}
	actx, acancel := context.WithTimeout(context.Background(), g.syncTimeout)
	err = ssrf.CheckAccess(actx, az.SelfSubjectAccessReviews(), pc)
	acancel()
	if err != nil {
		return nil, fmt.Errorf("--inference-pool %s: %w", g.pool, err)
	}
	w, err := ssrf.NewPoolWatcher(pc, dyn, log)
	if err != nil {
		return nil, err
	}
	w.Observe(metrics.NewPoolWatch(reg))
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, ready) }()
	stop := func() {
		cancel()
		<-done
	}
	select {
	case <-ready:
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("--inference-pool %s: %w", g.pool, err)
	case <-time.After(g.syncTimeout):
		stop()
		return nil, fmt.Errorf("--inference-pool %s: not synced within --ssrf-sync-timeout %v (RBAC: get/list/watch inferencepools and pods)", g.pool, g.syncTimeout)
	}
	lists := ssrf.Any{w}
	if g.static.Len() > 0 {
		lists = append(lists, g.static)
	}
	o.cfg.Guard.Allowlist = lists
	g.watcher = w
	return stop, nil
}

func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		c, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
		return c, nil
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster kubernetes config (or set --kubeconfig): %w", err)
	}
	return c, nil
}

// unknownMembersFlag is --kv-params-unknown-members: pass or refuse.
type unknownMembersFlag struct{ refuse *bool }

func (f unknownMembersFlag) String() string {
	if f.refuse != nil && *f.refuse {
		return "refuse"
	}
	return "pass"
}

func (f unknownMembersFlag) Set(v string) error {
	switch v {
	case "pass":
		*f.refuse = false
	case "refuse":
		*f.refuse = true
	default:
		return fmt.Errorf("%q: want pass or refuse", v)
	}
	return nil
}

func (unknownMembersFlag) Type() string { return "string" }
