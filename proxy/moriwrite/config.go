// Package moriwrite is MoRI-IO write mode on the nixlv2 connector (AMD's
// KV transfer engine: the prefill engine writes the prompt's KV into the
// decode engine) as a request feature: a split's legs carry MoRI-IO's
// kv_transfer_params (the rank, the transfer id, the hosts' addresses) and
// x-data-parallel-rank, serial (the prefill's body, then the decode's from
// its answer) or in parallel dispatch (both legs built at once); the host
// specs they name are resolved by the pod's resolver, and a split whose
// specs have no address yet waits on their resolution as a step. The wire
// shapes are connectors/moriio's.
package moriwrite

import (
	"errors"
	"fmt"
	"time"

	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/proxy/hostdns"
)

// Config is MoRI-IO write mode on the nixlv2 connector (AMD's KV
// transfer engine: the prefill engine writes the prompt's KV into the
// decode engine). Off unless WriteMode; ignored by other connectors.
type Config struct {
	// WriteMode turns MoRI-IO write mode on: serial (prefill, then decode)
	// unless ParallelDispatch.
	WriteMode bool
	// ParallelDispatch sends both legs at once; the decode leg's output is
	// held until the prefill leg answered, within WaitTimeout.
	ParallelDispatch bool
	// Ports are the notify and handshake ports and the TP/DP sizes.
	Ports moriio.Ports
	// PodIP is this (decode) pod's host spec: an IP, or a name resolved.
	PodIP string
	// RemoteHosts and DecodeHosts are the wide-EP prefill and decode host
	// specs (empty: a single host each).
	RemoteHosts, DecodeHosts []string
	// WaitTimeout bounds, in parallel dispatch, the wait for the prefill
	// leg's outcome before the decode leg produced output; past it the
	// request degrades to a local prefill (reason kv_wait_timeout).
	WaitTimeout time.Duration
	// DNSTTL is how long a resolved host spec is fresh; DNSTimeout bounds
	// each lookup.
	DNSTTL, DNSTimeout time.Duration
	// Seed holds the addresses of the host specs resolved at startup.
	Seed map[string]string
	// Lookup resolves names (nil: net.DefaultResolver.LookupHost).
	Lookup hostdns.LookupFunc
}

// Validate reports the first invalid MoRI-IO setting.
func (c Config) Validate() error {
	if !c.WriteMode {
		if c.ParallelDispatch {
			return errors.New("--moriio-parallel-dispatch needs --moriio-write-mode")
		}
		return nil
	}
	switch {
	case c.PodIP == "":
		return errors.New("--moriio-write-mode needs --moriio-local-pod-ip or POD_IP")
	case c.Ports.DPSize < 1 || c.Ports.TPSize < 1 || c.Ports.DPSizeLocal < 0:
		return fmt.Errorf("MoRI-IO sizes tp %d, dp %d, dp-local %d are invalid", c.Ports.TPSize, c.Ports.DPSize, c.Ports.DPSizeLocal)
	case c.WaitTimeout <= 0:
		return fmt.Errorf("--moriio-parallel-decode-wait-timeout %v must be > 0", c.WaitTimeout)
	case c.DNSTTL <= 0 || c.DNSTimeout <= 0:
		return fmt.Errorf("MoRI-IO DNS ttl %v and timeout %v must be > 0", c.DNSTTL, c.DNSTimeout)
	}
	return nil
}
