package enginesim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

// respond posts a Responses body and returns the answer.
func respond(t *testing.T, s *testSim, body string) answer {
	t.Helper()
	return post(t, s.url+"/v1/responses", body)
}

// respText is a Responses answer's text.
func respText(a answer) string {
	s, _ := get(a.json, "output", 0, "content", 0, "text").(string)
	return s
}

// TestResponsesConversation: a previous_response_id makes the prompt the
// previous response's conversation and output, then the new input, as
// vLLM's construct_input_messages does: the answer is the one of the same
// conversation sent whole as input, and a third turn chains on the second.
func TestResponsesConversation(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	one := respond(t, s, `{"model":"sim-model","input":"tell me a story","max_output_tokens":6}`)
	require.Equal(t, http.StatusOK, one.status, "%s", one.body)
	id, _ := get(one.json, "id").(string)
	require.NotEmpty(t, id)
	out1 := respText(one)

	two := respond(t, s, `{"model":"sim-model","input":"and then?","max_output_tokens":6,"previous_response_id":`+mustJSON(id)+`}`)
	require.Equal(t, http.StatusOK, two.status, "%s", two.body)
	whole := respond(t, s, `{"model":"sim-model","max_output_tokens":6,"input":[`+
		`{"role":"user","content":"tell me a story"},{"role":"assistant","content":`+mustJSON(out1)+`},{"role":"user","content":"and then?"}]}`)
	require.Equal(t, http.StatusOK, whole.status, "%s", whole.body)
	alone := respond(t, s, `{"model":"sim-model","input":"and then?","max_output_tokens":6}`)
	assert.Equal(t, respText(whole), respText(two), "the history is prepended")
	assert.Equal(t, get(whole.json, "usage", "input_tokens"), get(two.json, "usage", "input_tokens"))
	assert.NotEqual(t, respText(alone), respText(two), "the answer depends on the history")
	assert.Equal(t, 1.0, s.metricWhere(t, "sim_previous_responses_total", "result", "found"))

	id2, _ := get(two.json, "id").(string)
	three := respond(t, s, `{"model":"sim-model","input":"the end","max_output_tokens":6,"previous_response_id":`+mustJSON(id2)+`,"instructions":"be brief"}`)
	require.Equal(t, http.StatusOK, three.status, "%s", three.body)
	wholeThree := respond(t, s, `{"model":"sim-model","max_output_tokens":6,"instructions":"be brief","input":[`+
		`{"role":"user","content":"tell me a story"},{"role":"assistant","content":`+mustJSON(out1)+`},{"role":"user","content":"and then?"},`+
		`{"role":"assistant","content":`+mustJSON(respText(two))+`},{"role":"user","content":"the end"}]}`)
	assert.Equal(t, respText(wholeThree), respText(three), "the chain goes on, the new instructions first")
}

// TestResponsesUnknownPreviousIsTheCorpus404: a previous_response_id the
// engine does not hold is answered as vLLM answers it (the corpus's
// shape, the id in its message), for a stream too; so is every one with
// the store off, and one whose response asked not to be stored or was
// forgotten past the bound, or was a prefill leg's.
func TestResponsesUnknownPreviousIsTheCorpus404(t *testing.T) {
	shape, err := wirecorpus.Get("vllm-responses-unknown-previous-4d89a999")
	require.NoError(t, err)
	want := func(id string) map[string]any {
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(strings.ReplaceAll(string(shape.Value), "resp_unknown", id)), &v))
		return v
	}
	turn := func(prev string, extra string) string {
		return `{"model":"sim-model","input":"and then?","max_output_tokens":4,"previous_response_id":` + mustJSON(prev) + extra + `}`
	}
	idOf := func(a answer) string { s, _ := get(a.json, "id").(string); return s }

	s := startSim(t, RoleBoth, func(c *Config) { c.ResponsesStore = 2 })
	for _, extra := range []string{"", `,"stream":true`} {
		a := respond(t, s, turn("resp_unknown", extra))
		assert.Equal(t, shape.Status, a.status, "%s", a.body)
		assert.Equal(t, want("resp_unknown"), a.json)
	}
	assert.Equal(t, 2.0, s.metricWhere(t, "sim_previous_responses_total", "result", "unknown"))

	unstored := respond(t, s, `{"model":"sim-model","input":"hi","store":false}`)
	require.Equal(t, http.StatusOK, unstored.status)
	a := respond(t, s, turn(idOf(unstored), ""))
	assert.Equal(t, http.StatusNotFound, a.status, "store:false keeps nothing")
	assert.Equal(t, want(idOf(unstored)), a.json)

	var ids []string
	for _, in := range []string{"a", "b", "c"} {
		r := respond(t, s, `{"model":"sim-model","input":"`+in+`"}`)
		require.Equal(t, http.StatusOK, r.status)
		ids = append(ids, idOf(r))
	}
	assert.Equal(t, 2.0, s.metric(t, "sim_responses_stored"), "at most --responses-store kept")
	assert.Equal(t, http.StatusNotFound, respond(t, s, turn(ids[0], "")).status, "the oldest is forgotten")
	assert.Equal(t, http.StatusOK, respond(t, s, turn(ids[2], "")).status)

	prefill := startSim(t, RolePrefill, nil)
	leg := respond(t, prefill, `{"model":"sim-model","input":"hi","max_output_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`)
	require.Equal(t, http.StatusOK, leg.status, "%s", leg.body)
	assert.Equal(t, http.StatusNotFound, respond(t, prefill, turn(idOf(leg), "")).status, "a prefill leg's answer is not kept")

	off := startSim(t, RoleBoth, func(c *Config) { c.ResponsesStore = 0 })
	r := respond(t, off, `{"model":"sim-model","input":"hi"}`)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, http.StatusNotFound, respond(t, off, turn(idOf(r), "")).status, "the store off keeps nothing")
}

// TestResponsesConversationMembersChecked: previous_response_id and store
// of the wrong type are refused 400; null previous_response_id names none.
func TestResponsesConversationMembersChecked(t *testing.T) {
	s := startSim(t, RoleBoth, nil)
	for _, tc := range []struct {
		extra  string
		status int
	}{
		{`,"previous_response_id":7`, http.StatusBadRequest},
		{`,"store":"no"`, http.StatusBadRequest},
		{`,"previous_response_id":null`, http.StatusOK},
		{`,"store":null`, http.StatusOK},
	} {
		a := respond(t, s, `{"model":"sim-model","input":"hi"`+tc.extra+`}`)
		assert.Equal(t, tc.status, a.status, "%s: %s", tc.extra, a.body)
	}
}
