package connectors

import (
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
)

// PrefillParams reads what every sequential connector reads first from a
// prefill answer: the cached-token count and kv_transfer_params. An answer
// without params that finished by itself (EOS on the first token) gives a
// Done handoff and ok false; one that hit its cap without params gives
// ErrNoKVParams; a body that is not a JSON object, ErrBadPrefillAnswer.
// With ok true, params is the kv_transfer_params value for the connector
// to validate.
func PrefillParams(api API, answer []byte) (h Handoff, params gjson.Result, ok bool, err error) {
	if !IsObject(answer) {
		return Handoff{}, gjson.Result{}, false, fmt.Errorf("%w: not a JSON object", ErrBadPrefillAnswer)
	}
	// One pass over the answer's members for the two it reads, the first
	// of each name as gjson.Get finds it.
	var usage gjson.Result
	gjson.Parse(Bytes(answer)).ForEach(func(k, v gjson.Result) bool {
		switch {
		case k.Str == "usage" && !usage.Exists():
			usage = v
		case k.Str == "kv_transfer_params" && !params.Exists():
			params = v
		}
		return true
	})
	h = Handoff{CachedTokens: gjson.Get(usage.Raw, strings.TrimPrefix(api.CachedTokensPath(), "usage.")).Int()}
	if !params.Exists() || params.Type == gjson.Null {
		if stop, _ := Finished(api, answer); stop {
			h.Done = true
			return h, params, false, nil
		}
		if api == APIResponses && !params.Exists() {
			return h, params, false, ErrResponsesNoKVParams
		}
		return h, params, false, ErrNoKVParams
	}
	return h, params, true, nil
}
