// Package connectors holds the wire protocols between the sidecar and the
// inference engines. A connector is a pure transform: from the client's
// request body it produces the bodies of the prefill and decode legs, and
// from the prefill answer it reads the handoff the decode leg needs. It never
// opens a socket, logs or touches metrics; the proxy owns all of that.
package connectors

import (
	"fmt"
	"net/http"

	"github.com/pd-sidecar/pd-sidecar/failure"
)

// Sentinel errors a connector returns, each with what the proxy does
// about it (its failure.Outcome).
var (
	// ErrBadBody means the client body is not a JSON object the connector can
	// rewrite.
	ErrBadBody error = failure.New("connectors: request body is not a JSON object", failure.Outcome{Status: http.StatusBadRequest})
	// ErrNoKVParams means the prefill answer ended on its length cap but
	// carried no kv_transfer_params, so there is nothing to hand off.
	ErrNoKVParams error = failure.New("connectors: prefill answer carries no kv_transfer_params", failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonNoKVParams})
	// ErrResponsesNoKVParams is ErrNoKVParams on /v1/responses when the
	// answer has no kv_transfer_params member at all (not even null): the
	// engine does not do P/D on that path. vLLM carries them in Responses
	// answers from PR #37424 (March 2026) on (wirecorpus shape
	// vllm-responses-kv-params-pr37424).
	ErrResponsesNoKVParams = fmt.Errorf("%w: the prefill engine's /v1/responses answer has no kv_transfer_params member: an engine too old for P/D on this path (vLLM before PR #37424, 2026-03); upgrade it, or send this client's requests as /v1/chat/completions", ErrNoKVParams)
	// ErrInvalidKVParams means the prefill answer's kv_transfer_params lack a
	// field the decode engine needs (vLLM would silently prefill locally),
	// carry one the connector does not document, of another type or past
	// its bounds, or name an address the sidecar does not allow.
	ErrInvalidKVParams error = failure.New("connectors: invalid kv_transfer_params in prefill answer", failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonInvalidParams})
	// ErrBadPrefillAnswer means the prefill answer cannot be used: its body
	// is not a JSON object, or (wrapped by the proxy around its own reason)
	// the answer was refused before it was parsed.
	ErrBadPrefillAnswer error = failure.New("connectors: unusable prefill answer", failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonBadAnswer})
)

// Handoff is what the prefill answer tells the decode leg.
type Handoff struct {
	// Params is the prefill answer's kv_transfer_params as the decode body
	// carries them: written anew from the members the connector documents,
	// each checked for its type and bounds (Schema.Canonical), never the
	// answer's bytes. Nil when Done is true.
	Params []byte
	// Addrs are the addresses Params name for the decode side to connect
	// to (the prefiller's side channel, a kvtransfer agent): the proxy
	// checks them before anything connects.
	Addrs []Addr
	// Done reports that generation already ended on the prefill's first
	// token (EOS): the prefill answer is the whole answer and no decode leg
	// is needed.
	Done bool
	// Unknown names the members of Params that the connector's schema does
	// not document and let pass (Schema.Open): the proxy counts them, or
	// refuses the handoff when told to be strict.
	Unknown []string
	// TPSize is the prefill engine's tensor-parallel size (0 if not given).
	TPSize int
	// CachedTokens is the prefill answer's prompt cached-token count (0 if
	// absent); the decode answer reports this value instead of its own.
	CachedTokens int64
}

// Connector is a KV handoff wire protocol. On its own it only names
// itself; what the proxy does with it is declared by the abilities it
// implements: Sequential (prefill, read the handoff, decode; optionally
// DecodeFirst) or Concurrent (both legs in flight at once). The proxy runs
// the choreography; see Choreography. Implementations must be safe for
// concurrent use and must not modify the body slices they are given.
type Connector interface {
	// Name is the connector's --kv-connector value.
	Name() string
}

// Sequential turns one client request into the two legs of a sequential
// prefill→decode handoff.
type Sequential interface {
	Connector
	// PrefillBody returns the prefill leg's body for a client body sent to
	// api, appended to dst[:0].
	PrefillBody(dst []byte, api API, body []byte) ([]byte, error)
	// ParsePrefill reads the handoff from the prefill leg's JSON answer.
	// It returns ErrNoKVParams or ErrInvalidKVParams when the answer cannot
	// be handed off and Done is not set.
	ParsePrefill(api API, answer []byte) (Handoff, error)
	// DecodeBody returns the decode leg's body: the client body with the
	// handoff applied, appended to dst[:0].
	DecodeBody(dst []byte, api API, body []byte, h Handoff) ([]byte, error)
}

// AnswerRewriter is an optional ability of a Connector: it edits each piece
// of the decode answer (the whole JSON body, or one SSE data payload) before
// it reaches the client. It returns data unchanged when nothing applies.
type AnswerRewriter interface {
	RewriteAnswer(api API, data []byte, h Handoff) []byte
}
