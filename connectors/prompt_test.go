package connectors_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// TestEstimatePromptTokens: token ids count exactly, text as
// ceil(bytes/3) of the JSON text (a message's other members as raw JSON);
// a prompt whose length cannot be told is no estimate (ok false), so the
// short-prompt guard lets it go on.
func TestEstimatePromptTokens(t *testing.T) {
	long := strings.Repeat("word ", 300) // 1500 bytes: 500 tokens
	tests := []struct {
		name   string
		api    connectors.API
		body   string
		tokens int
		ok     bool
	}{
		// completions
		{"text prompt", connectors.APICompletions, `{"model":"m","prompt":"hello world"}`, 4, true}, // 11 bytes
		{"long text prompt", connectors.APICompletions, `{"prompt":"` + long + `"}`, 500, true},
		{"escapes count as written", connectors.APICompletions, `{"prompt":"a\nb"}`, 2, true}, // a \ n b
		{"multi-byte text", connectors.APICompletions, `{"prompt":"日本語"}`, 3, true},           // 9 bytes
		{"a list of one string", connectors.APICompletions, `{"prompt":["hello world"]}`, 4, true},
		{"a batch of strings is summed", connectors.APICompletions, `{"prompt":["abc","defgh"]}`, 3, true},
		{"token ids", connectors.APICompletions, `{"prompt":[101,102,103,104,105]}`, 5, true},
		{"a batch of token id lists is summed", connectors.APICompletions, `{"prompt":[[1,2],[3,4,5]]}`, 5, true},
		{"prompt_token_ids", connectors.APICompletions, `{"prompt_token_ids":[1,2,3],"max_tokens":4}`, 3, true},
		{"text and ids both count", connectors.APICompletions, `{"prompt":"abcdef","prompt_token_ids":[1,2]}`, 4, true},
		{"suffix counts", connectors.APICompletions, `{"prompt":"abc","suffix":"def"}`, 2, true},
		{"other members do not", connectors.APICompletions, `{"prompt":"abc","model":"` + long + `","stop":["x"]}`, 1, true},
		// generate
		{"generate token_ids", connectors.APIGenerate, `{"token_ids":[1,2,3,4],"sampling_params":{"max_tokens":4}}`, 4, true},
		{"generate text prompt", connectors.APIGenerate, `{"prompt":"abcdef"}`, 2, true},
		// chat: "user" is 6 bytes, the content's own bytes
		{"chat string content", connectors.APIChat, `{"messages":[{"role":"user","content":"hello world!"}]}`, 6, true},
		{"chat parts content", connectors.APIChat,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"hello"},{"type":"text","text":" world!"}]}]}`, 6, true},
		{"chat turns are summed", connectors.APIChat,
			`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`, 8, true}, // 8+8+6+2
		{"chat tool calls count as raw JSON", connectors.APIChat,
			`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c"}]}]}`, 8, true}, // 11+12
		{"chat tools count as raw JSON", connectors.APIChat,
			`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}`, 10, true}, // 6+2+21
		{"chat prompt field is not chat's", connectors.APIChat, `{"prompt":"hello","messages":[{"role":"user","content":"hi"}]}`, 3, true},
		// responses
		{"responses string input", connectors.APIResponses, `{"input":"hello world"}`, 4, true},
		{"responses items and instructions", connectors.APIResponses,
			`{"instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]}]}`, 7, true}, // 8+6+5
		// Anthropic messages
		{"messages string system", connectors.APIMessages,
			`{"system":"be brief","messages":[{"role":"user","content":"hello"}],"max_tokens":5}`, 7, true},
		{"messages system blocks", connectors.APIMessages,
			`{"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}`, 7, true},

		// no estimate: the request goes on as without the guard
		{"no prompt", connectors.APICompletions, `{"model":"m","max_tokens":3}`, 0, false},
		{"empty prompt", connectors.APICompletions, `{"prompt":""}`, 0, false},
		{"empty id list", connectors.APICompletions, `{"prompt":[]}`, 0, false},
		{"prompt of a wrong type", connectors.APICompletions, `{"prompt":42}`, 0, false},
		{"prompt object", connectors.APICompletions, `{"prompt":{"text":"hi"}}`, 0, false},
		{"mixed prompt list", connectors.APICompletions, `{"prompt":[1,"a"]}`, 0, false},
		{"id list with a string", connectors.APICompletions, `{"prompt":[[1,2],[3,"x"]]}`, 0, false},
		{"prompt_token_ids not a list", connectors.APICompletions, `{"prompt_token_ids":"1,2","prompt":"abc"}`, 0, false},
		{"generate token_ids of strings", connectors.APIGenerate, `{"token_ids":["a"]}`, 0, false},
		{"messages not a list", connectors.APIChat, `{"messages":"hello"}`, 0, false},
		{"a message not an object", connectors.APIChat, `{"messages":["hello"]}`, 0, false},
		{"content of a wrong type", connectors.APIChat, `{"messages":[{"role":"user","content":5}]}`, 0, false},
		{"a text part without text", connectors.APIChat, `{"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, 0, false},
		{"an image part", connectors.APIChat,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"what is it"},{"type":"image_url","image_url":{"url":"http://x/i.png"}}]}]}`, 0, false},
		{"a responses image part", connectors.APIResponses,
			`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x/i.png"}]}]}`, 0, false},
		{"an anthropic tool result", connectors.APIMessages,
			`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"42"}]}]}`, 0, false},
		{"instructions of a wrong type", connectors.APIResponses, `{"instructions":1,"input":"hi"}`, 0, false},
		{"not an object", connectors.APICompletions, `[{"prompt":"hi"}]`, 0, false},
		{"not JSON", connectors.APICompletions, `prompt: hi`, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, ok := connectors.EstimatePromptTokens(tc.api, []byte(tc.body))
			assert.Equal(t, tc.ok, ok, "ok")
			if tc.ok {
				assert.Equal(t, tc.tokens, n, "tokens")
			}
		})
	}
}
