package connectors_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
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
		{"object", `{"id":"x","ec_transfer_params":{"h1":{"metadata":{}}}}`, `{"h1":{"metadata":{}}}`, false},
		{"ec-nixl's entries, written anew", `{"ec_transfer_params":{ "h1" : {"peer_port":7001,"size_bytes":64,"peer_host":"10.0.0.5","shape":[ 2, 8 ]},"h2":{"metadata":{"grid":[1,2]}}}}`,
			`{"h1":{"peer_host":"10.0.0.5","peer_port":7001,"size_bytes":64,"shape":[2,8]},"h2":{"metadata":{"grid":[1,2]}}}`, false},
		{"the NIXL agent's metadata", `{"ec_transfer_params":{"h1":{"peer_host":"10.0.0.5","peer_port":7001,"size_bytes":64,"nixl_agent_metadata_b64":"TklYTAEA/+=="}}}`,
			`{"h1":{"peer_host":"10.0.0.5","peer_port":7001,"size_bytes":64,"nixl_agent_metadata_b64":"TklYTAEA/+=="}}`, false},
		{"an undocumented scalar", `{"ec_transfer_params":{"h1":{"peer_host":"10.0.0.5","peer_port":7001,"dtype_code":3}}}`,
			`{"h1":{"peer_host":"10.0.0.5","peer_port":7001,"dtype_code":3}}`, false},
		{"missing", `{"id":"x"}`, "", false},
		{"null", `{"ec_transfer_params":null}`, "", false},
		{"not an object", `{"ec_transfer_params":[1]}`, "", false},
		{"empty", `{"ec_transfer_params":{}}`, "", false},
		{"not json", `oops`, "", true},
		{"truncated", `{"ec_transfer_params":{"a":`, "", true},
		{"an undocumented member naming an address", `{"ec_transfer_params":{"h1":{"metadata":{},"kv_source":{"agent":"10.9.9.9:1"}}}}`, "", true},
		{"metadata naming an address", `{"ec_transfer_params":{"h1":{"metadata":{"url":"http://10.9.9.9/"}}}}`, "", true},
		{"a deep value", `{"ec_transfer_params":{"h1":{"metadata":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}}}`, "", true},
		{"an entry that is no object", `{"ec_transfer_params":{"h1":"10.9.9.9:1"}}`, "", true},
		{"a key given twice", `{"ec_transfer_params":{"h1":{"metadata":{}},"h1":{"metadata":{}}}}`, "", true},
		{"an escaped key", `{"ec_transfer_params":{"h\u0031":{"metadata":{}}}}`, "", true},
		{"a port that is no port", `{"ec_transfer_params":{"h1":{"peer_host":"10.0.0.5","peer_port":"x"}}}`, "", true},
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

// TestCorpusEncoderAnswers: every ec-nixl encoder answer of the upstream
// corpus is read whole, every entry's members as the encoder wrote them,
// and its peer named as an address to check.
func TestCorpusEncoderAnswers(t *testing.T) {
	shapes, err := wirecorpus.Select(connectors.ECNixl, wirecorpus.EncoderAnswer)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(shapes), 3)
	for _, s := range shapes {
		t.Run(s.Name, func(t *testing.T) {
			got, addrs, err := connectors.ECParamsOf(s.Body(`"id":"x"`))
			require.NoError(t, err)
			assert.JSONEq(t, string(s.Value), string(got))
			require.Len(t, addrs, 1)
			assert.Equal(t, "ec_transfer_params.peer_host", addrs[0].Field)
		})
	}
}
