// Package hideparams keeps the engines' kv_transfer_params from the
// client, a request feature registered unless --trust-client-kv-params.
// A decode engine's kv_transfer_params describe this pod's KV for the
// sidecar (multi-turn KV reuse keeps them for the conversation's next
// prefill): its NIXL side channel's host and port, its engine id, block
// and request ids. No client needs them (without
// --trust-client-kv-params a client's own are removed before any engine
// sees them), so in every answer an engine makes, a split's decode answer
// and a local one alike, they are written as null.
//
// A client's JSON parser takes the last of a repeated member and reads
// names decoded, so every member named kv_transfer_params is nulled: at
// any depth (the Responses API nests its answer in its events), every
// copy, a name spelled with \u escapes too. A piece that could name it and
// is not one well-formed JSON value (no parser reads one object in it; an
// SSE line a client would split at a bare CR) is written as null whole.
// What it costs when the bytes cannot name it, as in all but an answer's
// last piece: a search for the name and for an escaped ASCII letter.
package hideparams

import (
	"bytes"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// Member is the member an engine's answer never shows the client.
const Member = "kv_transfer_params"

// Feature hides the engines' kv_transfer_params from the client.
type Feature struct{}

// Begin takes part in every request: the same use for all, holding
// nothing.
func (Feature) Begin(feature.Request, feature.Head) feature.Use { return hide{} }

// hide is every request's part.
type hide struct{}

// AnswerEdit hides the params in each piece of a split's decode answer.
func (hide) AnswerEdit() func([]byte) []byte { return Hide }

// LocalAnswerEdit hides the params in each piece of a local answer.
func (hide) LocalAnswerEdit() func([]byte) []byte { return Hide }

var (
	member = []byte(Member)
	null   = []byte("null")
)

// Hide returns data, one JSON value (an answer, or an SSE event's data),
// with every member named kv_transfer_params written as null; data itself
// when none has another value. data that may name one and is not one
// well-formed JSON value is returned as null.
func Hide(data []byte) []byte {
	if !mayName(data) {
		return data
	}
	out, n, err := connectors.NullMembers(nil, data, Member)
	switch {
	case err != nil:
		return null
	case n == 0:
		return data
	}
	return out
}

// mayName reports whether data may hold a member name that decodes to
// kv_transfer_params: the name as it is, or an ASCII letter or '_' written
// as a \u escape (\u005f, \u006b...: only such an escape can spell one of
// its bytes). Engines escape control characters and, some, non-ASCII
// letters (\u00e9), never an ASCII letter.
func mayName(data []byte) bool {
	if bytes.Contains(data, member) {
		return true
	}
	for i := 0; ; {
		j := bytes.Index(data[i:], []byte(`\u00`))
		if j < 0 {
			return false
		}
		i += j + 4
		if i < len(data) && '5' <= data[i] && data[i] <= '7' {
			return true
		}
	}
}

var (
	_ feature.Feature           = Feature{}
	_ feature.AnswerEditor      = hide{}
	_ feature.LocalAnswerEditor = hide{}
)
