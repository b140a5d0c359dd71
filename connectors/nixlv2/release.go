package nixlv2

import (
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// ReleaseBody returns the decode body for h (the client body with the
// prefill answer's kv_transfer_params) capped at one output token, with
// stream false and stream_options, min_tokens and min_completion_tokens
// removed: a decode the engine runs only to read the KV blocks, which frees
// them on the prefill engine. Chat's max_completion_tokens, which vLLM
// prefers to max_tokens, is capped too when the client set it.
func (*Connector) ReleaseBody(dst []byte, api connectors.API, body []byte, h connectors.Handoff) ([]byte, error) {
	var buf [8]connectors.Edit
	edits := append(buf[:0],
		connectors.Edit{Key: "kv_transfer_params", Raw: h.Params},
		connectors.Edit{Key: "stream", Raw: falseV},
		connectors.Edit{Key: "stream_options", Delete: true},
		connectors.Edit{Key: "min_tokens", Delete: true},
		connectors.Edit{Key: "min_completion_tokens", Delete: true},
	)
	switch api {
	case connectors.APIChat:
		edits = append(edits, connectors.Edit{Key: "max_tokens", Raw: one})
		if gjson.GetBytes(body, "max_completion_tokens").Exists() {
			edits = append(edits, connectors.Edit{Key: "max_completion_tokens", Raw: one})
		}
	case connectors.APIResponses:
		edits = append(edits, connectors.Edit{Key: "max_output_tokens", Raw: one})
	case connectors.APIGenerate:
		edits = append(edits, connectors.Edit{Key: "sampling_params", Nested: samplingEdits})
	default:
		edits = append(edits, connectors.Edit{Key: "max_tokens", Raw: one})
	}
	return connectors.EditObject(dst[:0], body, edits)
}

var _ connectors.KVReleaser = (*Connector)(nil)
