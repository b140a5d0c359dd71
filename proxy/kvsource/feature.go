package kvsource

import (
	"bytes"
	"net"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/logvalue"
)

// Header names the engine (host:port of its HTTP server, as the endpoint
// picker knows it) whose P2P tier holds the prompt's prefix. Client
// controllable: allowlisted, stripped before forwarding.
const Header = "x-kv-cache-source-host-port"

// Feature is the KV cache source, a request feature: registered while the
// P2P tier is in use. It reads the request's x-kv-cache-source-host-port
// (the first): the engine to pull the prompt's prefix from. A source equal
// to the prefiller, or, without one, to the rank serving the request, an
// unusable value and one the allowlist refuses are not named; every
// outcome but "no header" is counted. The prefill leg's engine, or the
// local engine of a request none prefills remotely, is told to pull the
// prefix from the source first.
type Feature struct {
	// Ports are the pod's engines' HTTP and P2P ports.
	Ports Ports
	// Allowlist admits sources; nil admits every one.
	Allowlist Allowlist
	// OwnHost reports whether host names this pod.
	OwnHost func(host string) bool
	// Outcomes counts the outcomes (pd_sidecar_kv_sources_total).
	Outcomes *prometheus.CounterVec
	// NewID returns the request id of a P2P transfer.
	NewID func() string
}

// Begin names the request's source, when one is usable.
func (s Feature) Begin(r feature.Request, h feature.Head) feature.Use {
	if r.Refused {
		return nil // a fallback's leg is the client's own body
	}
	v := h.Peek(Header)
	if len(bytes.TrimSpace(v)) == 0 {
		return nil
	}
	src, o := Decide(string(v), Request{
		Prefiller: r.Prefiller, Port: r.Port, OwnHost: s.OwnHost, Allowlist: s.Allowlist,
	})
	s.Outcomes.WithLabelValues(o).Inc()
	if o != metrics.KVSourceUsed {
		r.Log.LogAt(zerolog.DebugLevel).Str("kv_cache_source", logvalue.Cut(string(v))).Str("outcome", o).Msg("kv cache source not named")
		return nil
	}
	peer := &connectors.P2PPeer{RequestID: s.NewID(), Host: src.Host, Port: s.Ports.P2PPort(src.Port)}
	r.Log.LogAt(zerolog.DebugLevel).Str("kv_cache_source", net.JoinHostPort(peer.Host, strconv.Itoa(peer.Port))).Msg("kv cache source named: remote_kv_source")
	return &kvSourceUse{peer: peer}
}

// kvSourceUse is a request's KV cache source.
type kvSourceUse struct{ peer *connectors.P2PPeer }

// EditPrefill names the source in the prefill leg (remote_kv_source).
func (u *kvSourceUse) EditPrefill(body []byte) ([]byte, error) {
	return connectors.WithKVSource(nil, body, *u.peer)
}

// EditLocal replaces the local request's kv_transfer_params with the
// source alone.
func (u *kvSourceUse) EditLocal(body []byte) ([]byte, error) {
	return connectors.OnlyKVSource(nil, body, *u.peer)
}

// KVSource is the source named.
func (u *kvSourceUse) KVSource() *connectors.P2PPeer { return u.peer }

var (
	_ feature.Feature       = Feature{}
	_ feature.PrefillEditor = (*kvSourceUse)(nil)
	_ feature.LocalEditor   = (*kvSourceUse)(nil)
	_ feature.KVSourceNamer = (*kvSourceUse)(nil)
)
