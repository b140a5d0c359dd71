package connectors

// API is the inference API a request path speaks; it decides which fields
// cap the number of generated tokens and where usage is reported.
type API uint8

// The inference APIs the sidecar splits into prefill and decode.
const (
	// APICompletions is POST /v1/completions.
	APICompletions API = iota + 1
	// APIChat is POST /v1/chat/completions.
	APIChat
	// APIResponses is POST /v1/responses.
	APIResponses
	// APIMessages is POST /v1/messages (Anthropic-style).
	APIMessages
	// APIGenerate is POST /inference/v1/generate (token in, token out).
	APIGenerate
)

// APIForPath returns the API served at path, and false for any path that is
// not an inference path (those are passed through unchanged).
func APIForPath(path string) (API, bool) {
	switch path {
	case "/v1/completions":
		return APICompletions, true
	case "/v1/chat/completions":
		return APIChat, true
	case "/v1/responses":
		return APIResponses, true
	case "/v1/messages":
		return APIMessages, true
	case "/inference/v1/generate":
		return APIGenerate, true
	}
	return 0, false
}

// String returns the API's path.
func (a API) String() string {
	switch a {
	case APICompletions:
		return "/v1/completions"
	case APIChat:
		return "/v1/chat/completions"
	case APIResponses:
		return "/v1/responses"
	case APIMessages:
		return "/v1/messages"
	case APIGenerate:
		return "/inference/v1/generate"
	}
	return "unknown"
}

// CachedTokensPath is the gjson/sjson path of the prompt cached-token count
// in an answer (or SSE chunk) of this API.
func (a API) CachedTokensPath() string {
	switch a {
	case APIResponses:
		return "usage.input_tokens_details.cached_tokens"
	case APIMessages:
		return "usage.cache_read_input_tokens"
	}
	return "usage.prompt_tokens_details.cached_tokens"
}
