package multiturn

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// TestRenderMembersChangeThePrefixSum: two turns whose text is the same
// but which differ in one member that changes the prompt's tokens (or the
// KV computed for them) have different prefix sums, for a chat and for a
// completion; a member that leaves the tokens alone changes nothing.
func TestRenderMembersChangeThePrefixSum(t *testing.T) {
	chat := `{"messages":[{"role":"user","content":"hello there"},{"role":"assistant","content":" hi"},{"role":"user","content":"more"}]%s}`
	completion := `{"prompt":"Once upon a time"%s}`
	tests := []struct {
		member string
		value  string
	}{
		{"model", `"n"`},
		{"tools", `[{"type":"function","function":{"name":"f"}}]`},
		{"tool_choice", `"auto"`},
		{"chat_template", `"{{ messages }}"`},
		{"chat_template_kwargs", `{"enable_thinking":false}`},
		{"documents", `[{"title":"t","text":"x"}]`},
		{"add_generation_prompt", `false`},
		{"continue_final_message", `true`},
		{"add_special_tokens", `true`},
		{"reasoning_effort", `"low"`},
		{"suffix", `"end"`},
		{"truncate_prompt_tokens", `16`},
		{"chat_template_content_format", `"openai"`},
		{"mm_processor_kwargs", `{"num_crops":4}`},
		{"media_io_kwargs", `{"video":{"num_frames":8}}`},
		{"prompt_embeds", `"AAAA"`},
		{"cache_salt", `"tenant-b"`},
	}
	for _, shape := range []struct {
		api  connectors.API
		body string
		n    int
	}{{connectors.APIChat, chat, 2}, {connectors.APICompletions, completion, 4}} {
		base, ok := ReadPrompt(shape.api, fmtBody(shape.body, ""), "")
		require.True(t, ok)
		same, _ := ReadPrompt(shape.api, fmtBody(shape.body, ""), "")
		require.Equal(t, base.PrefixSum(shape.n), same.PrefixSum(shape.n), "the same body sums alike")
		for _, tc := range tests {
			other, ok := ReadPrompt(shape.api, fmtBody(shape.body, `,"`+tc.member+`":`+tc.value), "")
			require.True(t, ok, tc.member)
			assert.NotEqual(t, base.PrefixSum(shape.n), other.PrefixSum(shape.n), "%s %s: a different prefix sum", shape.api, tc.member)
		}
		for _, sampling := range []string{`"temperature":0.5`, `"skip_special_tokens":false`, `"priority":3`, `"max_tokens":99`} {
			other, _ := ReadPrompt(shape.api, fmtBody(shape.body, ","+sampling), "")
			assert.Equal(t, base.PrefixSum(shape.n), other.PrefixSum(shape.n), "%s %s: the same prefix sum", shape.api, sampling)
		}
	}
}

func fmtBody(format, extra string) []byte {
	out := make([]byte, 0, len(format)+len(extra))
	for i := 0; i < len(format); i++ {
		if format[i] == '%' && i+1 < len(format) && format[i+1] == 's' {
			out = append(out, extra...)
			i++
			continue
		}
		out = append(out, format[i])
	}
	return out
}
