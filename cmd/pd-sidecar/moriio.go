package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/proxy/hostdns"
	"github.com/pd-sidecar/pd-sidecar/proxy/moriwrite"
)

// MoRI-IO's DNS environment (llm-d's names and defaults).
const (
	envMoriioDNSTTL     = "MORIIO_DNS_RESOLVE_TTL_SECONDS"
	envMoriioDNSTimeout = "MORIIO_DNS_RESOLVE_TIMEOUT_SECONDS"
	envMoriioMetrics    = "MORIIO_METRICS_ADDR"
	// envMoriioDNSServer is pd-sidecar's own: the DNS server (host:port)
	// MoRI-IO's host specs are resolved with instead of the system's.
	envMoriioDNSServer = "MORIIO_DNS_SERVER"
)

// envSeconds is the positive number of seconds in the environment variable
// name, else def.
func envSeconds(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("%s=%q is not a positive number of seconds", name, v)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// moriioLookup is the resolver of MoRI-IO's host specs: the system's, or
// the DNS server MORIIO_DNS_SERVER names.
func moriioLookup(getenv func(string) string) (hostdns.LookupFunc, error) {
	srv := getenv(envMoriioDNSServer)
	if srv == "" {
		return net.DefaultResolver.LookupHost, nil
	}
	if _, _, err := net.SplitHostPort(srv); err != nil {
		return nil, fmt.Errorf("%s=%q is not host:port", envMoriioDNSServer, srv)
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, srv)
	}}
	return r.LookupHost, nil
}

// config is the proxy's MoRI-IO configuration: the flags, the DNS
// environment, and every host spec resolved now (as llm-d does at start-up:
// a spec that does not resolve is an error).
func (m moriioOptions) config(getenv func(string) string) (moriwrite.Config, error) {
	if !m.writeMode {
		return moriwrite.Config{}, nil // off: the flags are not used
	}
	c := moriwrite.Config{
		WriteMode: m.writeMode, ParallelDispatch: m.parallelDispatch,
		Ports: moriio.Ports{
			DecodeNotify: m.decodeNotify, DecodeHandshake: m.decodeHandshake,
			PrefillNotify: m.prefillNotify, PrefillHandshake: m.prefillHandshake,
			TPSize: m.tpSize, DPSize: m.dpSize, DPSizeLocal: m.dpSizeLocal,
		},
		PodIP: m.localPodIP, RemoteHosts: m.remoteHosts, DecodeHosts: m.decodeHosts,
		WaitTimeout: m.waitTimeout,
	}
	var err error
	if c.DNSTTL, err = envSeconds(getenv, envMoriioDNSTTL, 30*time.Second); err != nil {
		return c, err
	}
	if c.DNSTimeout, err = envSeconds(getenv, envMoriioDNSTimeout, 5*time.Second); err != nil {
		return c, err
	}
	if c.Lookup, err = moriioLookup(getenv); err != nil {
		return c, err
	}
	c.Seed = map[string]string{}
	specs := append(append([]string{m.localPodIP}, m.remoteHosts...), m.decodeHosts...)
	for _, spec := range specs {
		if _, ok := c.Seed[spec]; ok || net.ParseIP(spec) != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.DNSTimeout)
		ip, err := hostdns.PickIP(ctx, c.Lookup, spec)
		cancel()
		if err != nil {
			return c, fmt.Errorf("MoRI-IO host %q does not resolve: %w", spec, err)
		}
		c.Seed[spec] = ip
	}
	return c, nil
}

// moriioMetricsPort is the port of MORIIO_METRICS_ADDR (":9090" or
// "host:9090"), llm-d's fallback for an unset --metrics-port; 0 when unset.
func moriioMetricsPort(getenv func(string) string) (int, error) {
	v := getenv(envMoriioMetrics)
	if v == "" {
		return 0, nil
	}
	_, port, err := net.SplitHostPort(v)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n <= 0 || n > 65535 {
		return 0, fmt.Errorf("%s=%q is not a listen address like :9090", envMoriioMetrics, v)
	}
	return n, nil
}
