package connectors_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// TestScanBodyOneParse: a request body decoders would read differently is
// refused as ErrAmbiguousJSON, at any depth for a repeated name, in the
// objects the sidecar reads for a case variant; what every decoder reads
// alike passes.
func TestScanBodyOneParse(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		ok         bool
	}{
		{"plain", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, true},
		{"an escaped name alone", `{"messages":[{"role":"user","\u0063ontent":"hi"}]}`, true},
		{"a surrogate pair", `{"prompt":"\ud83d\ude00"}`, true},
		{"case variants where nothing reads by name", `{"tools":[{"type":"function","function":{"name":"car","parameters":{"properties":{"Model":{},"model":{}}}}}]}`, true},
		{"an unknown name in upper case", `{"prompt":"p","X_Custom":1}`, true},
		{"content twice", `{"messages":[{"role":"user","content":"a","content":"b"}]}`, false},
		{"role twice", `{"messages":[{"role":"user","content":"a","role":"system"}]}`, false},
		{"messages twice", `{"messages":[],"messages":[{"role":"user","content":"a"}]}`, false},
		{"prompt twice", `{"prompt":"a","max_tokens":4,"prompt":"b"}`, false},
		{"content twice, one escaped", `{"messages":[{"role":"user","content":"a","\u0063ontent":"b"}]}`, false},
		{"prompt twice, escaped otherwise", `{"pr\u006fmpt":"a","\u0070rompt":"b"}`, false},
		{"a repeated name deep in a tool schema", `{"tools":[{"function":{"parameters":{"a":1,"a":2}}}]}`, false},
		{"Content in a message", `{"messages":[{"role":"user","Content":"b"}]}`, false},
		{"Content beside content", `{"messages":[{"role":"user","content":"a","Content":"b"}]}`, false},
		{"ROLE", `{"messages":[{"ROLE":"system","content":"a"}]}`, false},
		{"Messages", `{"Messages":[{"role":"user","content":"a"}]}`, false},
		{"Stream", `{"prompt":"a","Stream":true}`, false},
		{"a long s folds to s", `{"prompt":"a","ſtream":true}`, false},
		{"a Kelvin sign folds to k", `{"prompt":"a","max_to\u212aens":1}`, false},
		{"Include_Usage", `{"prompt":"a","stream_options":{"Include_Usage":true}}`, false},
		{"a content part's TEXT", `{"messages":[{"role":"user","content":[{"type":"text","TEXT":"a"}]}]}`, false},
		{"Max_Tokens in sampling_params", `{"sampling_params":{"Max_Tokens":1}}`, false},
		{"a lone high surrogate", `{"prompt":"\ud800"}`, false},
		{"a lone low surrogate", `{"prompt":"\udc00x"}`, false},
		{"a high surrogate then a letter escape", `{"prompt":"\ud800\u0041"}`, false},
		{"a lone surrogate in a name", `{"\ud800":1}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := connectors.ScanBody(connectors.APIChat, []byte(tc.body))
			if tc.ok {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, connectors.ErrAmbiguousJSON)
			assert.False(t, errors.Is(err, connectors.ErrMalformedJSON), "ambiguous is not malformed")
		})
	}
}

// TestValidObjectManyMembers: an object past the scanned members keeps its
// names in a set: a repeat among thousands is found, and nested objects
// keep their own names.
func TestValidObjectManyMembers(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"logit_bias":{`)
	for i := range 5000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + strconv.Itoa(i) + `":{"a":1,"b":{"a":2}}`)
	}
	ok := b.String() + `}}`
	assert.NoError(t, connectors.ValidObject([]byte(ok)))
	assert.ErrorIs(t, connectors.ValidObject([]byte(b.String()+`,"4999":0}}`)), connectors.ErrAmbiguousJSON)
	assert.ErrorIs(t, connectors.ValidObject([]byte(b.String()+`,"\u0034\u0039\u0039\u0038":0}}`)), connectors.ErrAmbiguousJSON)
}

// typedRequest is a request as a Go engine reads it (engine-sim,
// llm-d-inference-sim): encoding/json into struct fields, which takes the
// last of a repeated name and matches names case-insensitively. Its fields
// are members the sidecar acts on.
type typedRequest struct {
	Model         json.RawMessage `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        json.RawMessage `json:"stream"`
	MaxTokens     json.RawMessage `json:"max_tokens"`
	N             json.RawMessage `json:"n"`
	BestOf        json.RawMessage `json:"best_of"`
	KVParams      json.RawMessage `json:"kv_transfer_params"`
	StreamOptions *struct {
		IncludeUsage json.RawMessage `json:"include_usage"`
	} `json:"stream_options"`
	Messages []struct {
		Role      json.RawMessage `json:"role"`
		Content   json.RawMessage `json:"content"`
		Name      json.RawMessage `json:"name"`
		Reasoning json.RawMessage `json:"reasoning_content"`
		ToolCalls json.RawMessage `json:"tool_calls"`
	} `json:"messages"`
}

// FuzzOneParse: on every body ScanBody accepts, the sidecar's reading
// (gjson: the first of a repeated name) agrees with a last-member decoder
// (encoding/json into maps, as Python's json reads) and with a typed,
// case-insensitive one (typedRequest) on every member the sidecar acts on.
func FuzzOneParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":"a","content":"b"}]}`,
		`{"messages":[{"role":"user","content":"a","\u0063ontent":"b"}]}`,
		`{"messages":[{"role":"user","Content":"b"}]}`,
		`{"prompt":"a","prompt":"b","max_tokens":1}`,
		`{"prompt":"\ud83d\ude00","n":1,"best_of":1}`,
		`{"kv_transfer_params":{"remote_host":"h","remote_host":"i"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := connectors.ScanBody(connectors.APIChat, b); err != nil {
			return
		}
		var last map[string]any
		require.NoError(t, json.Unmarshal(b, &last), "accepted, so well-formed")
		top := []string{"model", "prompt", "stream", "max_tokens", "n", "best_of", "kv_transfer_params", "messages", "stream_options"}
		for _, k := range top {
			sameValue(t, b, k, gjson.GetBytes(b, k), last[k])
		}
		if so, ok := last["stream_options"].(map[string]any); ok {
			sameValue(t, b, "stream_options.include_usage", gjson.GetBytes(b, "stream_options.include_usage"), so["include_usage"])
		}
		if ms, ok := last["messages"].([]any); ok {
			first := gjson.GetBytes(b, "messages").Array()
			require.Len(t, first, len(ms))
			for i, m := range ms {
				mm, ok := m.(map[string]any)
				if !ok {
					continue
				}
				for _, k := range []string{"role", "content", "name", "reasoning_content", "reasoning", "tool_calls", "tool_call_id"} {
					sameValue(t, b, "messages."+k, first[i].Get(k), mm[k])
				}
			}
		}
		var typed typedRequest
		if json.Unmarshal(b, &typed) != nil {
			return // a Go engine refuses it: it reads nothing
		}
		for k, raw := range map[string]json.RawMessage{"model": typed.Model, "prompt": typed.Prompt, "stream": typed.Stream,
			"max_tokens": typed.MaxTokens, "n": typed.N, "best_of": typed.BestOf, "kv_transfer_params": typed.KVParams} {
			sameRaw(t, b, k, gjson.GetBytes(b, k), raw)
		}
		if typed.StreamOptions != nil {
			sameRaw(t, b, "stream_options.include_usage", gjson.GetBytes(b, "stream_options.include_usage"), typed.StreamOptions.IncludeUsage)
		}
		first := gjson.GetBytes(b, "messages").Array()
		for i, m := range typed.Messages {
			if i >= len(first) || !first[i].IsObject() {
				continue
			}
			sameRaw(t, b, "messages.role", first[i].Get("role"), m.Role)
			sameRaw(t, b, "messages.content", first[i].Get("content"), m.Content)
			sameRaw(t, b, "messages.name", first[i].Get("name"), m.Name)
			sameRaw(t, b, "messages.reasoning_content", first[i].Get("reasoning_content"), m.Reasoning)
			sameRaw(t, b, "messages.tool_calls", first[i].Get("tool_calls"), m.ToolCalls)
		}
	})
}

// sameValue: gjson's reading of a member equals the last-member decoder's.
func sameValue(t *testing.T, body []byte, what string, g gjson.Result, want any) {
	t.Helper()
	if !g.Exists() {
		require.Nil(t, want, "%s: the sidecar reads it absent, a last-member decoder does not: %q", what, body)
		return
	}
	var got any
	require.NoError(t, json.Unmarshal([]byte(g.Raw), &got))
	require.True(t, reflect.DeepEqual(got, want), "%s: the sidecar reads %s, a last-member decoder %v: %q", what, g.Raw, want, body)
}

// sameRaw: gjson's reading of a member equals a typed decoder's raw value
// (nil: absent or null).
func sameRaw(t *testing.T, body []byte, what string, g gjson.Result, raw json.RawMessage) {
	t.Helper()
	if raw == nil || bytes.Equal(raw, []byte("null")) {
		require.True(t, !g.Exists() || g.Type == gjson.Null, "%s: a typed decoder reads it absent, the sidecar %s: %q", what, g.Raw, body)
		return
	}
	var got, want any
	require.True(t, g.Exists(), "%s: a typed decoder reads %s, the sidecar nothing: %q", what, raw, body)
	require.NoError(t, json.Unmarshal([]byte(g.Raw), &got))
	require.NoError(t, json.Unmarshal(raw, &want))
	require.True(t, reflect.DeepEqual(got, want), "%s: the sidecar reads %s, a typed decoder %s: %q", what, g.Raw, raw, body)
}
