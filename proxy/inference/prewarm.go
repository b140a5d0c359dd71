package inference

import (
	"net"
	"strconv"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/prewarm"
)

// Sentinel errors of a warm-up (prewarm's).
var (
	// ErrPrewarmNoKV: the warm-up's prefill answer handed off no KV.
	ErrPrewarmNoKV = prewarm.ErrNoKV
	// ErrPrewarmStatus: a warm-up leg was answered with an error status.
	ErrPrewarmStatus = prewarm.ErrStatus
	// ErrNoModel: the local engine's GET /v1/models named no model.
	ErrNoModel = prewarm.ErrNoModel
)

// newPrewarmer returns the warm-ups of p's new prefillers
// (--prefill-prewarm): its split, through its transport, to each of its
// local engines, with its checks of a handoff.
func newPrewarmer(p *Proxy) *prewarm.Warmer {
	locals := make([]string, p.Cfg.DataParallelSize)
	for rank := range locals {
		locals[rank] = p.LocalAddr(rank)
	}
	return prewarm.New(prewarm.Deps{
		Covered:        p.prewarmCovered,
		Own:            p.ownAddr,
		Seq:            p.Seq,
		CheckHandoff:   p.checkHandoff,
		TPGuard:        p.tpGuard,
		Transport:      p.Tr,
		Locals:         locals,
		PrefillTimeout: p.Cfg.PrefillTimeout,
		ConnectTimeout: p.Cfg.ConnectTimeout,
		Count:          p.M.Prewarms,
		Log:            p.Log,
	})
}

// prewarmCovered reports why the connector's split cannot be warmed up,
// or "" when it can: only a sequential split whose decode leg hands the
// local engine the prefill's kv_transfer_params and lets it pull the KV
// (nixlv2) has an engine-to-engine handshake to pay ahead. The concurrent
// connectors (sglang, mooncake, offloading) are not built for it, the
// decode-first one (shared-storage) moves KV through storage, the sidecar's
// own pull (--kv-connector sidecar) is not the engine's, and MoRI-IO write
// mode's prefiller writes into the decoder with per-request fields.
func (p *Proxy) prewarmCovered() string {
	switch {
	case p.Seq == nil || p.Choreo != connectors.ChoreographySequential:
		return "the connector's split is not a prefill then a decode" // a constant: asked on every request
	case p.KV != nil:
		return "the sidecar pulls the KV itself"
	case p.Mori != nil:
		return "MoRI-IO write mode"
	}
	return ""
}

// NotePrefiller tells the proxy that hostport (host:port) is a prefiller
// now (the InferencePool watcher's new Ready pod): with --prefill-prewarm
// it is warmed up, even when seen before (a pod that came back is a new
// engine, with no connection to the local one). It never blocks.
func (p *Proxy) NotePrefiller(hostport string) {
	p.warm.Saw(hostport, true)
}

// ownAddr reports whether hp is one of the sidecar's own ports: warming
// it would send the sidecar requests of its own.
func (p *Proxy) ownAddr(hp string) bool {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < p.Cfg.Port || n >= p.Cfg.Port+p.Cfg.DataParallelSize {
		return false
	}
	if host == p.Cfg.PodIP || host == p.Cfg.Host || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

var _ background = (*prewarm.Warmer)(nil)
