package connectors

import (
	"bytes"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

var (
	capOne   = []byte("1")
	capFalse = []byte("false")
)

// samplingCapEdits cap /inference/v1/generate's sampling_params; read only.
var samplingCapEdits = []Edit{
	{Key: "max_tokens", Raw: capOne},
	{Key: "min_tokens", Delete: true},
}

// PrefillCapEdits appends the edits that turn a client body of api into a
// one-token, non-streamed prefill leg: stream false; stream_options,
// min_tokens and min_completion_tokens removed; the API's own token cap set
// to 1 (max_tokens, plus max_completion_tokens for chat; max_output_tokens
// for /v1/responses; sampling_params.max_tokens for generate).
func PrefillCapEdits(edits []Edit, api API) []Edit {
	edits = append(edits,
		Edit{Key: "stream", Raw: capFalse},
		Edit{Key: "stream_options", Delete: true},
		Edit{Key: "min_tokens", Delete: true},
		Edit{Key: "min_completion_tokens", Delete: true},
	)
	switch api {
	case APIChat:
		return append(edits, Edit{Key: "max_tokens", Raw: capOne}, Edit{Key: "max_completion_tokens", Raw: capOne})
	case APIResponses:
		return append(edits, Edit{Key: "max_output_tokens", Raw: capOne})
	case APIGenerate:
		return append(edits, Edit{Key: "sampling_params", Nested: samplingCapEdits})
	}
	return append(edits, Edit{Key: "max_tokens", Raw: capOne})
}

var cachedKeys = [][]byte{[]byte("cached_tokens"), []byte("cache_read_input_tokens")}

// RewriteCachedTokens sets the prompt cached-token count of a decode answer
// of api (the JSON body, or one SSE data payload, including the nested
// response/message objects of the Responses and Messages streams) to n. It
// returns data unchanged when it carries no such count.
func RewriteCachedTokens(api API, data []byte, n int64) []byte {
	if !bytes.Contains(data, cachedKeys[0]) && !bytes.Contains(data, cachedKeys[1]) {
		return data
	}
	base := api.CachedTokensPath()
	for _, path := range [...]string{base, "response." + base, "message." + base} {
		if !gjson.Get(Bytes(data), path).Exists() {
			continue
		}
		if out, err := sjson.SetBytes(data, path, n); err == nil {
			data = out
		}
	}
	return data
}
