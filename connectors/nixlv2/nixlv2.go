// Package nixlv2 is the vLLM NixlConnector wire protocol (engine-pull): the
// prefill leg asks the prefill engine to keep the prompt's KV blocks for a
// remote decoder and answer with their location (kv_transfer_params); the
// decode leg hands those params to the local engine, which pulls the blocks
// itself and decodes.
package nixlv2

import (
	"bytes"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Name is the --kv-connector value of this connector.
const Name = "nixlv2"

// prefillParams is the kv_transfer_params of every prefill leg.
var prefillParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

var (
	one    = []byte("1")
	falseV = []byte("false")
)

// Connector is the nixlv2 connector. The zero value is ready to use.
type Connector struct{}

// New returns a nixlv2 connector.
func New() *Connector { return &Connector{} }

// Name returns "nixlv2".
func (*Connector) Name() string { return Name }

// PrefillBody returns the client body with stream false, stream_options,
// min_tokens and min_completion_tokens removed, the API's token cap set to 1
// and kv_transfer_params asking for a remote decode.
func (*Connector) PrefillBody(dst []byte, api connectors.API, body []byte) ([]byte, error) {
	var buf [8]connectors.Edit
	edits := append(buf[:0],
		connectors.Edit{Key: "stream", Raw: falseV},
		connectors.Edit{Key: "stream_options", Delete: true},
		connectors.Edit{Key: "min_tokens", Delete: true},
		connectors.Edit{Key: "min_completion_tokens", Delete: true},
		connectors.Edit{Key: "kv_transfer_params", Raw: prefillParams},
	)
	switch api {
	case connectors.APIChat:
		edits = append(edits,
			connectors.Edit{Key: "max_tokens", Raw: one},
			connectors.Edit{Key: "max_completion_tokens", Raw: one})
	case connectors.APIResponses:
		edits = append(edits, connectors.Edit{Key: "max_output_tokens", Raw: one})
	case connectors.APIGenerate:
		edits = append(edits, connectors.Edit{Key: "sampling_params", Nested: samplingEdits})
	default:
		edits = append(edits, connectors.Edit{Key: "max_tokens", Raw: one})
	}
	return connectors.EditObject(dst[:0], body, edits)
}

// samplingEdits cap /inference/v1/generate's sampling_params; read only.
var samplingEdits = []connectors.Edit{
	{Key: "max_tokens", Raw: one},
	{Key: "min_tokens", Delete: true},
}

// ParsePrefill reads kv_transfer_params, tp_size and the cached-token count
// from the prefill answer. An answer without params that finished by itself
// (EOS on the first token) is Done; one that hit its cap without params is
// ErrNoKVParams; params that lack what the decode engine needs, or carry
// anything Params does not document, are ErrInvalidKVParams. The handoff's
// Params are written anew from the members read, and its Addrs name the
// side channel they point the decode engine at.
func (*Connector) ParsePrefill(api connectors.API, answer []byte) (connectors.Handoff, error) {
	h, p, ok, err := connectors.PrefillParams(api, answer)
	if !ok {
		return h, err
	}
	return connectors.ReadHandoff(h, p, &Params)
}

// DecodeBody returns the client body with kv_transfer_params replaced by the
// handoff's (the prefill answer's, as ParsePrefill read them). Every other
// field is the client's own.
func (*Connector) DecodeBody(dst []byte, _ connectors.API, body []byte, h connectors.Handoff) ([]byte, error) {
	edits := [1]connectors.Edit{{Key: "kv_transfer_params", Raw: h.Params}}
	return connectors.EditObject(dst[:0], body, edits[:])
}

var cachedKeys = [][]byte{[]byte("cached_tokens"), []byte("cache_read_input_tokens")}

// RewriteAnswer sets the decode answer's prompt cached-token count (in the
// JSON body or in one SSE chunk) to the prefiller's: the decoder received
// the whole prompt's KV remotely and would otherwise report it all cached.
func (*Connector) RewriteAnswer(api connectors.API, data []byte, h connectors.Handoff) []byte {
	if !bytes.Contains(data, cachedKeys[0]) && !bytes.Contains(data, cachedKeys[1]) {
		return data
	}
	base := api.CachedTokensPath()
	for _, in := range [...]string{"", "response", "message"} {
		if v := valueAt(data, in, base); v.Exists() {
			data = setInt(data, v, in, base, h.CachedTokens)
		}
	}
	return data
}

// valueAt is the value at path in the object that is member in of data's
// (in "": data itself), its Index counted in data (0: not known).
func valueAt(data []byte, in, path string) gjson.Result {
	js := connectors.Bytes(data)
	if in == "" {
		return gjson.Get(js, path)
	}
	o := gjson.Get(js, in)
	if !o.IsObject() {
		return gjson.Result{}
	}
	v := gjson.Get(o.Raw, path)
	if o.Index > 0 && v.Index > 0 {
		v.Index += o.Index
	} else {
		v.Index = 0
	}
	return v
}

// setInt returns data with v, the value at path in its member in (valueAt),
// written as n: the bytes around it copied once into a new slice (data is
// a read's buffer).
func setInt(data []byte, v gjson.Result, in, path string, n int64) []byte {
	end := v.Index + len(v.Raw)
	if v.Index <= 0 || end > len(data) || string(data[v.Index:end]) != v.Raw {
		// Not found in place: sjson sets it.
		if in != "" {
			path = in + "." + path
		}
		if out, err := sjson.SetBytes(data, path, n); err == nil {
			return out
		}
		return data
	}
	out := make([]byte, 0, len(data)-len(v.Raw)+20)
	out = append(out, data[:v.Index]...)
	out = strconv.AppendInt(out, n, 10)
	return append(out, data[end:]...)
}

var (
	_ connectors.Sequential     = (*Connector)(nil)
	_ connectors.AnswerRewriter = (*Connector)(nil)
)
