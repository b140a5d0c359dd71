// Package sidecar is the sidecar-pull wire protocol (--kv-connector
// sidecar): the prefill leg asks the prefill engine to hold the prompt's KV
// blocks with its kvtransfer agent and answer a KV source descriptor; the
// sidecar pulls the blocks itself into blocks it borrows from the local
// engine (kvtransfer), and the decode leg names those pre-loaded blocks.
// The contract an engine implements is CONTRACT.md in this directory.
//
// Like every connector this is a pure transform; the proxy owns the pull,
// the allocation calls and all other I/O.
package sidecar

import (
	"encoding/json"
	"fmt"

	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Name is the --kv-connector value of this connector.
const Name = "sidecar"

// prefillParams is the kv_transfer_params of every prefill leg: nixlv2's,
// plus pull_mode asking for a kv_source descriptor.
var prefillParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null,"pull_mode":"sidecar"}`)

// Preloaded names the local engine's blocks that hold a request's pulled
// KV; it is kv_transfer_params.kv_preloaded of the decode leg.
type Preloaded struct {
	// AllocID is the local engine's allocation (POST /kv/alloc).
	AllocID string `json:"alloc_id"`
	// BlockIDs are the local blocks, in prompt order.
	BlockIDs []int `json:"block_ids"`
	// NumTokens is the number of prompt tokens they hold.
	NumTokens int `json:"num_tokens"`
}

// Connector is the sidecar connector. The zero value is ready to use.
type Connector struct{}

// New returns a sidecar connector.
func New() *Connector { return &Connector{} }

// Name returns "sidecar".
func (*Connector) Name() string { return Name }

// PrefillBody returns the client body capped to one token, not streamed,
// with kv_transfer_params asking for a remote decode with a sidecar pull.
func (*Connector) PrefillBody(dst []byte, api connectors.API, body []byte) ([]byte, error) {
	var buf [10]connectors.Edit
	edits := connectors.PrefillCapEdits(buf[:0], api)
	edits = append(edits, connectors.Edit{Key: "kv_transfer_params", Raw: prefillParams})
	return connectors.EditObject(dst[:0], body, edits)
}

// ParsePrefill reads kv_transfer_params.kv_source from the prefill answer.
// Handoff.Params is the descriptor, written anew from the members Source
// documents; Handoff.Addrs its agent. An answer without params that
// finished by itself is Done; one that hit its cap without params is
// ErrNoKVParams; params without a usable kv_source, or with anything
// Params does not document, are ErrInvalidKVParams.
func (*Connector) ParsePrefill(api connectors.API, answer []byte) (connectors.Handoff, error) {
	h, p, ok, err := connectors.PrefillParams(api, answer)
	if !ok {
		return h, err
	}
	if !p.Get("kv_source").IsObject() {
		return h, fmt.Errorf("%w: no kv_source (is the prefill engine serving a kvtransfer agent?)", connectors.ErrInvalidKVParams)
	}
	out, addrs, err := Params.Canonical(nil, p)
	if err != nil {
		return h, err
	}
	h.TPSize = int(gjson.GetBytes(out, "tp_size").Int())
	h.Params = []byte(gjson.GetBytes(out, "kv_source").Raw)
	h.Addrs = addrs
	return h, nil
}

// KVSource returns the raw kv_source descriptor of a handoff read by
// ParsePrefill.
func (*Connector) KVSource(h connectors.Handoff) ([]byte, error) {
	if !gjson.ValidBytes(h.Params) || !gjson.GetBytes(h.Params, "agent").Exists() {
		return nil, fmt.Errorf("%w: handoff carries no kv_source", connectors.ErrInvalidKVParams)
	}
	return h.Params, nil
}

// Preloaded returns the decode leg's handoff once the KV is in the local
// engine's blocks.
func (*Connector) Preloaded(h connectors.Handoff, p Preloaded) (connectors.Handoff, error) {
	raw, err := json.Marshal(map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "kv_preloaded": p})
	if err != nil {
		return h, fmt.Errorf("%w: %w", connectors.ErrInvalidKVParams, err)
	}
	h.Params = raw
	return h, nil
}

// DecodeBody returns the client body with kv_transfer_params naming the
// pre-loaded blocks; h must come from Preloaded (a handoff still carrying
// the kv_source is refused: the engine would decode from blocks nobody
// pulled).
func (*Connector) DecodeBody(dst []byte, _ connectors.API, body []byte, h connectors.Handoff) ([]byte, error) {
	if !gjson.GetBytes(h.Params, "kv_preloaded.alloc_id").Exists() {
		return dst, fmt.Errorf("%w: decode leg without pre-loaded blocks", connectors.ErrInvalidKVParams)
	}
	edits := [1]connectors.Edit{{Key: "kv_transfer_params", Raw: h.Params}}
	return connectors.EditObject(dst[:0], body, edits[:])
}

// RewriteAnswer reports the prefiller's cached-token count in the decode
// answer (the decoder received the whole prompt's KV).
func (*Connector) RewriteAnswer(api connectors.API, data []byte, h connectors.Handoff) []byte {
	return connectors.RewriteCachedTokens(api, data, h.CachedTokens)
}

var (
	_ connectors.Sequential     = (*Connector)(nil)
	_ connectors.AnswerRewriter = (*Connector)(nil)
)
