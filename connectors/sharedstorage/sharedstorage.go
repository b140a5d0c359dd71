// Package sharedstorage is the shared-storage (LMCache-style) P/D protocol:
// the prefill engine writes the prompt's KV to a store the decode engine
// also reads, so the handoff carries no parameters. A request with
// cache_hit_threshold is tried on the decode engine first; only when it
// answers finish_reason "cache_threshold" (its cache hit ratio is below the
// threshold) does the prefill run, with cache_hit_threshold 0, followed by
// the decode again with cache_hit_threshold 0.
package sharedstorage

import (
	"fmt"

	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Name is the --kv-connector value of this connector.
const Name = "shared-storage"

// FinishCacheThreshold is the finish reason of a decode that declined
// because its cache hit ratio was below cache_hit_threshold.
const FinishCacheThreshold = "cache_threshold"

const thresholdKey = "cache_hit_threshold"

var zero = []byte("0")

// Connector is the shared-storage connector. The zero value is ready to use.
type Connector struct{}

// New returns a shared-storage connector.
func New() *Connector { return &Connector{} }

// Name returns "shared-storage".
func (*Connector) Name() string { return Name }

func hasThreshold(body []byte) bool {
	v := gjson.Get(connectors.Bytes(body), thresholdKey)
	return v.Exists() && v.Type != gjson.Null
}

// PrefillBody returns the client body capped to one non-streamed token
// (see connectors.PrefillCapEdits), with cache_hit_threshold 0 when the
// client set one.
func (*Connector) PrefillBody(dst []byte, api connectors.API, body []byte) ([]byte, error) {
	var buf [10]connectors.Edit
	edits := connectors.PrefillCapEdits(buf[:0], api)
	if hasThreshold(body) {
		edits = append(edits, connectors.Edit{Key: thresholdKey, Raw: zero})
	}
	return connectors.EditObject(dst[:0], body, edits)
}

// ParsePrefill reads the prefiller's cached-token count. The KV went to the
// shared store, so there are no parameters to hand over; a prefill that
// ended by itself on its first token is Done.
func (*Connector) ParsePrefill(api connectors.API, answer []byte) (connectors.Handoff, error) {
	if !connectors.IsObject(answer) {
		return connectors.Handoff{}, fmt.Errorf("%w: not a JSON object", connectors.ErrBadPrefillAnswer)
	}
	h := connectors.Handoff{CachedTokens: gjson.Get(connectors.Bytes(answer), api.CachedTokensPath()).Int()}
	h.Done, _ = connectors.Finished(api, answer)
	return h, nil
}

// DecodeBody returns the client body, with cache_hit_threshold 0 when the
// client set one (the KV is in the store now; the decode must not decline).
func (*Connector) DecodeBody(dst []byte, _ connectors.API, body []byte, _ connectors.Handoff) ([]byte, error) {
	if !hasThreshold(body) {
		return append(dst[:0], body...), nil
	}
	return connectors.EditObject(dst[:0], body, []connectors.Edit{{Key: thresholdKey, Raw: zero}})
}

// TryDecodeFirst reports whether the client set cache_hit_threshold.
func (*Connector) TryDecodeFirst(_ connectors.API, body []byte) bool { return hasThreshold(body) }

// Declined reports whether a decode answer or SSE payload finished with
// "cache_threshold": choices[0].finish_reason (completions, chat,
// generate), stop_reason or delta.stop_reason (messages),
// incomplete_details.reason or response.incomplete_details.reason
// (responses).
func (*Connector) Declined(api connectors.API, data []byte) bool {
	js := connectors.Bytes(data)
	var paths []string
	switch api {
	case connectors.APIMessages:
		paths = []string{"stop_reason", "delta.stop_reason", "message.stop_reason"}
	case connectors.APIResponses:
		paths = []string{"incomplete_details.reason", "response.incomplete_details.reason"}
	default:
		paths = []string{"choices.0.finish_reason"}
	}
	for _, p := range paths {
		if gjson.Get(js, p).Str == FinishCacheThreshold {
			return true
		}
	}
	return false
}

// AfterDecline returns the client body with cache_hit_threshold 0: the
// prefill, the second decode and a local fallback must not decline again.
func (*Connector) AfterDecline(dst []byte, _ connectors.API, body []byte) ([]byte, error) {
	return connectors.EditObject(dst[:0], body, []connectors.Edit{{Key: thresholdKey, Raw: zero}})
}

// RewriteAnswer sets the decode answer's prompt cached-token count to the
// prefiller's: the decoder loaded the prompt's KV from the store and would
// report it all cached.
func (*Connector) RewriteAnswer(api connectors.API, data []byte, h connectors.Handoff) []byte {
	return connectors.RewriteCachedTokens(api, data, h.CachedTokens)
}

var (
	_ connectors.Sequential     = (*Connector)(nil)
	_ connectors.DecodeFirst    = (*Connector)(nil)
	_ connectors.AnswerRewriter = (*Connector)(nil)
)
