package connectors

import (
	"net/http"

	"github.com/pd-sidecar/pd-sidecar/failure"
)

// ErrUnsupportedRequest means the connector cannot split this request on
// the disaggregated path (for example SGLang with n > 1); the proxy answers
// 400 with the wrapped message and contacts no engine.
var ErrUnsupportedRequest error = failure.New("connectors: request not supported on the disaggregated path", failure.Outcome{Status: http.StatusBadRequest})

// ErrBadBootstrap means a prefiller's bootstrap answer (Mooncake's
// GET /query) is unusable.
var ErrBadBootstrap error = failure.New("connectors: unusable bootstrap answer", failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonBootstrapFailed})

// Choreography is how the proxy runs a connector's legs. It is written once
// in the proxy and chosen by the abilities a connector implements.
type Choreography uint8

// The choreographies.
const (
	// ChoreographySequential: the prefill leg, then the decode leg built
	// from the prefill answer (Sequential).
	ChoreographySequential Choreography = iota + 1
	// ChoreographyConcurrent: both legs in flight at once; the decode engine
	// fetches the KV from the prefill engine by itself (Concurrent).
	ChoreographyConcurrent
	// ChoreographyDecodeFirst: the decode leg first; only when the decode
	// engine declines does the sequential handoff run (Sequential plus
	// DecodeFirst).
	ChoreographyDecodeFirst
)

// String names the choreography.
func (c Choreography) String() string {
	switch c {
	case ChoreographySequential:
		return "sequential"
	case ChoreographyConcurrent:
		return "concurrent"
	case ChoreographyDecodeFirst:
		return "decode-first"
	}
	return "none"
}

// ChoreographyOf returns the choreography c declares by its abilities, or 0
// when c implements none (an invalid connector).
func ChoreographyOf(c Connector) Choreography {
	if _, ok := c.(Concurrent); ok {
		return ChoreographyConcurrent
	}
	if _, ok := c.(Sequential); !ok {
		return 0
	}
	if _, ok := c.(DecodeFirst); ok {
		return ChoreographyDecodeFirst
	}
	return ChoreographySequential
}

// Pairing is the per-request state both legs of a concurrent split share.
// The proxy fills it; connectors use what their protocol needs.
type Pairing struct {
	// PrefillHost is the prefiller's host, without port.
	PrefillHost string
	// Room is a random number in [0, 2^63) (SGLang's bootstrap_room).
	Room uint64
	// TransferID is a fresh "xfer-<uuid>" (Mooncake's transfer_id).
	TransferID string
	// Bootstrap is the prefiller's bootstrap answer, for connectors that
	// implement Bootstrapper (zero otherwise).
	Bootstrap Bootstrap
	// KVRequestID is a fresh uuid: the kv_request_id under which the
	// prefill engine holds the prompt's blocks for the decode engine's P2P
	// pull (offloading).
	KVRequestID string
	// PrefillP2PPort is the port of the prefill engine's P2P KV tier
	// (offloading).
	PrefillP2PPort int
	// Source, when set, is the engine whose P2P tier the prefill engine
	// pulls the prompt's cached prefix from first
	// (x-kv-cache-source-host-port; offloading).
	Source *P2PPeer
}

// Concurrent is a connector whose two legs are sent at once: the decode
// engine gets the KV from the prefill engine itself (through a bootstrap
// server), so the decode body does not depend on the prefill answer.
type Concurrent interface {
	Connector
	// Legs returns the prefill and decode legs' bodies for a client body
	// sent to api. ErrUnsupportedRequest refuses the request.
	Legs(api API, body []byte, pr Pairing) (prefill, decode []byte, err error)
}

// Bootstrap is what a prefiller's bootstrap server says about it.
type Bootstrap struct {
	// URL is the bootstrap server's base URL (http://host:port).
	URL string
	// EngineID is the prefill engine's id.
	EngineID string
	// Rank is the data-parallel rank the engine id belongs to ("" if none).
	Rank string
	// Ranks are every rank the answer names with its engine id, in rank
	// order (EngineID and Rank are the first's).
	Ranks []RankEngine
}

// RankEngine is one data-parallel rank of a bootstrap answer.
type RankEngine struct {
	Rank, EngineID string
}

// PrefillRanker is an optional ability of a Concurrent connector: the
// data-parallel rank its prefill leg asks the prefill engine to run on
// (the X-data-parallel-rank header, which the proxy sets on the prefill
// leg alone, the client's own left out), or "" for none.
type PrefillRanker interface {
	PrefillRank(pr Pairing) string
}

// Bootstrapper is an optional ability of a Concurrent connector: before the
// legs, the proxy GETs BootstrapPath on BootstrapAddr(prefill host) (cached
// per prefiller, bounded, with a timeout) and hands ParseBootstrap's result
// to Legs in Pairing.Bootstrap.
type Bootstrapper interface {
	// BootstrapAddr returns the host:port of the prefiller's bootstrap
	// server.
	BootstrapAddr(prefillHost string) string
	// BootstrapPath is the path to GET, e.g. "/query".
	BootstrapPath() string
	// ParseBootstrap reads the answer; ErrBadBootstrap when unusable.
	ParseBootstrap(addr string, answer []byte) (Bootstrap, error)
}

// DecodeFirst is an optional ability of a Sequential connector: requests
// it selects are tried on the decode engine first, and the sequential
// handoff runs only when the decode engine declines them.
type DecodeFirst interface {
	// TryDecodeFirst reports whether body is to be tried on the decode
	// engine first.
	TryDecodeFirst(api API, body []byte) bool
	// Declined reports whether a decode answer (the whole JSON body, or one
	// SSE data payload) declined the request.
	Declined(api API, data []byte) bool
	// AfterDecline returns the client body every later leg, and a local
	// fallback, starts from once the decode engine declined.
	AfterDecline(dst []byte, api API, body []byte) ([]byte, error)
}
