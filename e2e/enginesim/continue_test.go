package enginesim

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chatBody is a chat request of messages (JSON) and extra top-level members.
func chatBody(messages string, maxTokens int, extra string) string {
	b := `{"model":"sim-model","messages":` + messages + `,"max_tokens":` + mustJSON(maxTokens)
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

const userTurn = `[{"role":"user","content":"tell me a long story"}]`

func withAssistant(content string) string {
	return `[{"role":"user","content":"tell me a long story"},{"role":"assistant","content":` + mustJSON(content) + `}]`
}

// A decode cut into pieces, each continuing the assistant message with the
// text so far, makes the one-shot output token for token.
func TestContinueFinalMessageIsTokenExact(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	one := post(t, s.url+"/v1/chat/completions", chatBody(userTurn, 12, ""))
	require.Equal(t, 200, one.status)
	want := get(one.json, "choices", 0, "message", "content").(string)
	text := ""
	for _, n := range []int{5, 5, 2} {
		var b string
		if text == "" {
			b = chatBody(userTurn, n, "")
		} else {
			b = chatBody(withAssistant(text), n, `"continue_final_message":true,"add_generation_prompt":false`)
		}
		a := post(t, s.url+"/v1/chat/completions", b)
		require.Equal(t, 200, a.status, "%v", a.json)
		text += get(a.json, "choices", 0, "message", "content").(string)
	}
	assert.Equal(t, want, text)
	assert.Len(t, strings.Fields(text), 12)
	assert.Equal(t, 2.0, s.metric(t, "sim_continued_messages_total"))
}

func TestContinueFinalMessageRefusals(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	for name, b := range map[string]string{
		"both on":            chatBody(withAssistant(" kalo"), 2, `"continue_final_message":true`),
		"last not assistant": chatBody(userTurn, 2, `"continue_final_message":true,"add_generation_prompt":false`),
		"not a boolean":      chatBody(userTurn, 2, `"continue_final_message":"yes"`),
	} {
		a := post(t, s.url+"/v1/chat/completions", b)
		assert.Equal(t, 400, a.status, name)
	}
	assert.Zero(t, s.metric(t, "sim_continued_messages_total"))
}

// The continued content counts as prompt tokens; eos_after_tokens stops at
// an absolute output position, continued or not.
func TestContinueUsageAndEOSAfterTokens(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"eos_after_tokens":7}`)
	one := post(t, s.url+"/v1/chat/completions", chatBody(userTurn, 20, ""))
	assert.Equal(t, "stop", get(one.json, "choices", 0, "finish_reason"))
	assert.EqualValues(t, 8, get(one.json, "usage", "completion_tokens"))
	prompt := get(one.json, "usage", "prompt_tokens").(float64)
	first := post(t, s.url+"/v1/chat/completions", chatBody(userTurn, 4, ""))
	assert.Equal(t, "length", get(first.json, "choices", 0, "finish_reason"))
	part := get(first.json, "choices", 0, "message", "content").(string)
	rest := post(t, s.url+"/v1/chat/completions", chatBody(withAssistant(part), 10, `"continue_final_message":true,"add_generation_prompt":false`))
	assert.Equal(t, "stop", get(rest.json, "choices", 0, "finish_reason"))
	assert.EqualValues(t, 4, get(rest.json, "usage", "completion_tokens"))
	assert.EqualValues(t, prompt+4, get(rest.json, "usage", "prompt_tokens"))
	assert.Equal(t, get(one.json, "choices", 0, "message", "content"), part+get(rest.json, "choices", 0, "message", "content").(string))
}

func TestFaultSkip(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	setFaults(t, s, `{"status":500,"skip":2,"times":1}`)
	for i, want := range []int{200, 200, 500, 200} {
		assert.Equal(t, want, post(t, s.url+"/v1/completions", smallCompletion).status, "request %d", i)
	}
}
