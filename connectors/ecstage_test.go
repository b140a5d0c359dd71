package connectors_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

func TestMMItems(t *testing.T) {
	img := func(u string) string { return `{"type":"image_url","image_url":{"url":"` + u + `"}}` }
	audio := `{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}`
	for _, tc := range []struct {
		name string
		body string
		want []string
	}{
		{"no messages", `{"prompt":"hi"}`, nil},
		{"string content", `{"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"text parts only", `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, nil},
		{"every kind, in order", `{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},` +
			img("http://x/1.png") + `,{"type":"audio_url","audio_url":{"url":"http://x/a.wav"}},{"type":"video_url","video_url":{"url":"http://x/v.mp4"}},` + audio + `]}]}`,
			[]string{img("http://x/1.png"), `{"type":"audio_url","audio_url":{"url":"http://x/a.wav"}}`, `{"type":"video_url","video_url":{"url":"http://x/v.mp4"}}`, audio}},
		{"url items deduplicated across messages", `{"messages":[{"role":"user","content":[` + img("http://x/1.png") + `,` + img("http://x/2.png") + `]},{"role":"user","content":[` + img("http://x/1.png") + `]}]}`,
			[]string{img("http://x/1.png"), img("http://x/2.png")}},
		{"same url, other type: not a duplicate", `{"messages":[{"role":"user","content":[` + img("http://x/1") + `,{"type":"video_url","video_url":{"url":"http://x/1"}}]}]}`,
			[]string{img("http://x/1"), `{"type":"video_url","video_url":{"url":"http://x/1"}}`}},
		{"input_audio never deduplicated", `{"messages":[{"role":"user","content":[` + audio + `,` + audio + `]}]}`, []string{audio, audio}},
		{"unknown types and non-objects skipped", `{"messages":[{"role":"user","content":[{"type":"file"},"x",3]}]}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, it := range connectors.MMItems([]byte(tc.body)) {
				got = append(got, string(it.Raw))
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestEncoderBody(t *testing.T) {
	item := connectors.MMItem{Type: "image_url", Raw: []byte(`{"type":"image_url","image_url":{"url":"u"}}`)}
	for _, tc := range []struct{ name, in, want string }{
		{"chat streamed with usage",
			`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"temperature":0}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}],"stream":false,"max_tokens":1,"temperature":0}`},
		{"max_completion_tokens capped when present",
			`{"model":"m","messages":[],"max_completion_tokens":9}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}],"max_completion_tokens":1,"max_tokens":1,"stream":false}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := connectors.EncoderBody(nil, []byte(tc.in), item)
			require.NoError(t, err)
			assert.JSONEq(t, tc.want, string(out))
		})
	}
	_, err := connectors.EncoderBody(nil, []byte(`[1]`), item)
	assert.ErrorIs(t, err, connectors.ErrBadBody)
}

func TestECParamsOf(t *testing.T) {
	for _, tc := range []struct {
		name, answer, want string
		err                bool
	}{
		{"object", `{"id":"x","ec_transfer_params":{"h1":{"handle":"a"}}}`, `{"h1":{"handle":"a"}}`, false},
		{"ec-nixl's entries, written anew", `{"ec_transfer_params":{ "h1" : {"remote_port":7001,"handle":"a","remote_host":"10.0.0.5"},"h2":{"handle":"b"}}}`,
			`{"h1":{"handle":"a","remote_host":"10.0.0.5","remote_port":7001},"h2":{"handle":"b"}}`, false},
		{"missing", `{"id":"x"}`, "", false},
		{"null", `{"ec_transfer_params":null}`, "", false},
		{"not an object", `{"ec_transfer_params":[1]}`, "", false},
		{"empty", `{"ec_transfer_params":{}}`, "", false},
		{"not json", `oops`, "", true},
		{"truncated", `{"ec_transfer_params":{"a":`, "", true},
		{"an undocumented member", `{"ec_transfer_params":{"h1":{"handle":"a","kv_source":{}}}}`, "", true},
		{"a deep value", `{"ec_transfer_params":{"h1":{"handle":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}}}`, "", true},
		{"an entry that is no object", `{"ec_transfer_params":{"h1":"10.9.9.9:1"}}`, "", true},
		{"a key given twice", `{"ec_transfer_params":{"h1":{"handle":"a"},"h1":{"handle":"b"}}}`, "", true},
		{"an escaped key", `{"ec_transfer_params":{"h\u0031":{"handle":"a"}}}`, "", true},
		{"a port that is no port", `{"ec_transfer_params":{"h1":{"handle":"a","remote_host":"10.0.0.5","remote_port":"x"}}}`, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := connectors.ECParamsOf([]byte(tc.answer))
			if tc.err {
				assert.ErrorIs(t, err, connectors.ErrECAnswer)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
		})
	}
}

func TestMergeECParams(t *testing.T) {
	for _, tc := range []struct {
		name  string
		base  string
		parts []string
		want  string
	}{
		{"nothing", "", nil, ""},
		{"one", "", []string{`{"a":1}`}, `{"a":1}`},
		{"flat, later wins in place", "", []string{`{"a":1,"b":2}`, `{"b":3,"c":4}`}, `{"a":1,"b":3,"c":4}`},
		{"into the request's own", `{"z":0,"a":9}`, []string{`{"a":1}`}, `{"z":0,"a":1}`},
		{"base not an object ignored", `[1]`, []string{`{"a":1}`}, `{"a":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var parts [][]byte
			for _, p := range tc.parts {
				parts = append(parts, []byte(p))
			}
			var base []byte
			if tc.base != "" {
				base = []byte(tc.base)
			}
			assert.Equal(t, tc.want, string(connectors.MergeECParams(base, parts)))
		})
	}
}

func TestECStageBody(t *testing.T) {
	out, err := connectors.ECStageBody(nil, []byte(`{"model":"m","cache_hit_threshold":0.5}`), []byte(`{"a":1}`))
	require.NoError(t, err)
	assert.Equal(t, `{"model":"m","cache_hit_threshold":0,"ec_transfer_params":{"a":1}}`, string(out))
	out, err = connectors.ECStageBody(nil, []byte(`{"model":"m"}`), nil)
	require.NoError(t, err)
	assert.Equal(t, `{"model":"m","cache_hit_threshold":0}`, string(out))
	assert.Equal(t, "r1-enc-2", connectors.ECRequestID("r1", 2))
}
