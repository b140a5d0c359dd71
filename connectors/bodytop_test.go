package connectors

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

// TestScanBodyStreamFlags: the stream flags ScanBody reads are gjson.Get's
// of the top level (nested ones do not count); a body that is not one JSON
// object is refused, and so is one that names stream twice.
func TestScanBodyStreamFlags(t *testing.T) {
	cases := []struct {
		body          string
		stream, usage bool
	}{
		{`{"model":"m","stream":true}`, true, false},
		{`{"stream_options":{"include_usage":true},"messages":[{"stream":false}],"stream":true}`, true, true},
		{`{"messages":[{"role":"user","content":"stream"}],"stream":false,"stream_options":{"include_usage":true}}`, false, true},
		{`{"stream":null,"stream_options":{"include_usage":null}}`, false, false},
		{`{"stream":false,"stream_options":{}}`, false, false},
		{`{"nested":{"stream":true}}`, false, false},
		{`{"str\u0065am":true}`, true, false},
	}
	for _, tc := range cases {
		top, err := ScanBody(APIChat, []byte(tc.body))
		require.NoError(t, err, tc.body)
		want := [2]bool{gjson.Get(tc.body, "stream").Bool(), gjson.Get(tc.body, "stream_options.include_usage").Bool()}
		assert.Equal(t, [2]bool{tc.stream, tc.usage}, [2]bool{top.Stream, top.Usage}, "%s", tc.body)
		assert.Equal(t, want, [2]bool{top.Stream, top.Usage}, "agrees with gjson.Get: %s", tc.body)
	}
	for _, bad := range []string{`[{"stream":true}]`, `not json`, ``, `{"stream":true`, `{"stream":tru}`} {
		_, err := ScanBody(APIChat, []byte(bad))
		assert.ErrorIs(t, err, ErrMalformedJSON, bad)
	}
	for _, bad := range []string{`{"stream":true,"stream":false}`, `{"stream":false,"str\u0065am":true}`, `{"Stream":true}`,
		`{"stream":"yes"}`, `{"stream":"true"}`, `{"stream":1}`, `{"stream":0}`, `{"stream":[]}`,
		`{"stream":true,"stream_options":{"include_usage":1}}`, `{"stream_options":{"include_usage":"on"}}`} {
		_, err := ScanBody(APIChat, []byte(bad))
		assert.ErrorIs(t, err, ErrAmbiguousJSON, bad)
	}
}

// TestScanBodyFields: the client connector fields ScanBody finds are
// FindClientFields', on every API (generate's nested ones included).
func TestScanBodyFields(t *testing.T) {
	bodies := []string{
		`{"model":"m","prompt":"p"}`,
		`{"kv_transfer_params":{"remote_host":"x"},"bootstrap_room":1,"ec_transfer_params":{}}`,
		`{"k\u0076_transfer_params":{},"messages":[{"kv_transfer_params":1}]}`,
		`{"sampling_params":{"extra_args":{"kv_transfer_params":{},"transfer_id":"t"}},"bootstrap_host":"h"}`,
		`{"prompt":"` + strings.Repeat("kv_transfer_params ", 1000) + `"}`,
	}
	for _, api := range []API{APICompletions, APIChat, APIGenerate} {
		for _, b := range bodies {
			top, err := ScanBody(api, []byte(b))
			require.NoError(t, err)
			want, err := FindClientFields(api, []byte(b))
			require.NoError(t, err)
			assert.Equal(t, want, top.Fields, "api %v: %s", api, b)
		}
	}
}

// FuzzScanBody: ScanBody refuses what ValidObject refuses, and besides
// only case variants of names it reads (ErrAmbiguousJSON); on what it
// accepts it agrees with FindClientFields and gjson.Get.
func FuzzScanBody(f *testing.F) {
	for _, s := range []string{`{"stream":true,"stream_options":{"include_usage":true}}`, `{"kv_transfer_params":{}}`,
		`{"sampling_params":{"extra_args":{"transfer_id":1}}}`, `{"a":[1,{"stream":false}]}`, `[]`, `{"x":"\u00e9"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, api := range []API{APIChat, APIGenerate} {
			top, err := ScanBody(api, b)
			if ValidObject(b) != nil {
				require.Error(t, err)
				continue
			}
			if err != nil {
				require.ErrorIs(t, err, ErrAmbiguousJSON)
				continue
			}
			want, err := FindClientFields(api, b)
			require.NoError(t, err)
			require.Equal(t, want, top.Fields)
			require.Equal(t, gjson.GetBytes(b, "stream").Bool(), top.Stream)
			require.Equal(t, gjson.GetBytes(b, "stream_options.include_usage").Bool(), top.Usage)
		}
	})
}
