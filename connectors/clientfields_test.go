package connectors_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

func TestStripClientFields(t *testing.T) {
	kv := `{"do_remote_prefill":true,"remote_host":"10.9.9.9","remote_port":5600,"remote_engine_id":"e","remote_block_ids":[1],"remote_request_id":"r"}`
	cases := []struct {
		name    string
		api     connectors.API
		in      string
		want    string // "" = unchanged
		removed []string
		err     bool
	}{
		{name: "none", in: `{"model":"m","prompt":"hi"}`},
		{name: "kv_transfer_params", in: `{"model":"m","kv_transfer_params":` + kv + `,"prompt":"hi"}`,
			want: `{"model":"m","prompt":"hi"}`, removed: []string{"kv_transfer_params"}},
		{name: "ec_transfer_params", in: `{"ec_transfer_params":{"remote_host":"x"},"prompt":"hi"}`,
			want: `{"prompt":"hi"}`, removed: []string{"ec_transfer_params"}},
		{name: "sglang bootstrap", in: `{"prompt":"hi","bootstrap_host":"10.1.1.1","bootstrap_port":8998,"bootstrap_room":7,"bootstrap_pair_key":"k"}`,
			want: `{"prompt":"hi"}`, removed: []string{"bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key"}},
		{name: "inner names at the top level", in: `{"remote_bootstrap_addr":"http://x:1","transfer_id":"t","kv_source":{"agent":"x:1"},"kv_preloaded":{},"prompt":"hi"}`,
			want: `{"prompt":"hi"}`, removed: []string{"remote_bootstrap_addr", "transfer_id", "kv_source", "kv_preloaded"}},
		{name: "duplicates: every copy goes", in: `{"kv_transfer_params":null,"prompt":"hi","kv_transfer_params":` + kv + `}`,
			want: `{"prompt":"hi"}`, removed: []string{"kv_transfer_params"}},
		{name: "escaped name", in: `{"prompt":"hi","kv_transfer_para\u006ds":` + kv + `}`,
			want: `{"prompt":"hi"}`, removed: []string{"kv_transfer_params"}},
		{name: "fully escaped name", in: `{"\u006b\u0076\u005f\u0074ransfer_params":{},"prompt":"hi"}`,
			want: `{"prompt":"hi"}`, removed: []string{"kv_transfer_params"}},
		{name: "escaped look-alike stays", in: `{"kv_transfer_para\u006d":1,"prompt":"\u00e9"}`},
		{name: "blanks around members", in: " {\n \"a\" : 1 ,\n\t\"bootstrap_host\" : \"x\" , \"b\":[1, {\"c\":\"}\"}]\n}\n",
			want: `{"a" : 1,"b":[1, {"c":"}"}]}`, removed: []string{"bootstrap_host"}},
		{name: "only the field", in: `{"kv_transfer_params":{}}`, want: `{}`, removed: []string{"kv_transfer_params"}},
		{name: "nested look-alikes stay", in: `{"messages":[{"role":"user","kv_transfer_params":{"remote_host":"x"}}],"metadata":{"bootstrap_host":"x"}}`},
		{name: "strings holding the names stay", in: `{"prompt":"\"kv_transfer_params\": {\"remote_host\": 1}, bootstrap_host","stop":["transfer_id\\"]}`},
		{name: "generate: sampling_params.extra_args", api: connectors.APIGenerate,
			in:   `{"token_ids":[1,2],"sampling_params":{"max_tokens":3,"extra_args":{"kv_transfer_params":` + kv + `,"x":1}},"kv_transfer_params":{}}`,
			want: `{"token_ids":[1,2],"sampling_params":{"max_tokens":3,"extra_args":{"x":1}}}`, removed: []string{"kv_transfer_params"}},
		{name: "other APIs: sampling_params not walked", api: connectors.APIChat,
			in: `{"sampling_params":{"extra_args":{"kv_transfer_params":{}}}}`},
		{name: "malformed: unterminated", in: `{"kv_transfer_params":{"a":1}`, err: true},
		{name: "malformed: data after the object", in: `{"prompt":"a"}{"kv_transfer_params":{}}`, err: true},
		{name: "malformed: not an object", in: `["kv_transfer_params"]`, err: true},
		{name: "malformed: trailing comma", in: `{"kv_transfer_params":1,}`, err: true},
		{name: "malformed: missing colon", in: `{"a" 1,"kv_transfer_params":1}`, err: true},
		{name: "malformed: unbalanced", in: `{"a":[1},"kv_transfer_params":1}`, err: true},
		{name: "malformed without any name", in: `{"prompt": "hi"`, err: true},
		{name: "empty", in: ``, err: true},
		{name: "NaN is skipped like any scalar", in: `{"a":NaN,"bootstrap_room":1}`, want: `{"a":NaN}`, removed: []string{"bootstrap_room"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			api := c.api
			if api == 0 {
				api = connectors.APICompletions
			}
			out, removed, err := connectors.StripClientFields(nil, api, []byte(c.in))
			if c.err {
				require.ErrorIs(t, err, connectors.ErrMalformedJSON)
				return
			}
			require.NoError(t, err)
			want := c.want
			if want == "" {
				want = c.in
			}
			assert.Equal(t, want, string(out))
			assert.Equal(t, c.removed, removed.Names())
			found, err := connectors.FindClientFields(api, []byte(c.in))
			require.NoError(t, err)
			assert.Equal(t, removed, found)
		})
	}
}

func TestClientAddrs(t *testing.T) {
	allow := func(hp string) bool { return hp == "10.0.0.1:5600" || hp == "10.0.0.1:8998" || hp == "[fd00::1]:8998" }
	cases := []struct {
		name, api, in, refused string
	}{
		{name: "none", in: `{"prompt":"hi"}`},
		{name: "nixl allowed", in: `{"kv_transfer_params":{"remote_host":"10.0.0.1","remote_port":5600}}`},
		{name: "nixl denied", in: `{"kv_transfer_params":{"remote_host":"10.6.6.6","remote_port":5600}}`, refused: "kv_transfer_params"},
		{name: "nixl null host", in: `{"kv_transfer_params":{"do_remote_decode":true,"remote_host":null,"remote_port":null}}`},
		{name: "host without port", in: `{"kv_transfer_params":{"remote_host":"10.0.0.1"}}`, refused: "kv_transfer_params"},
		{name: "repeated host: every copy checked", in: `{"kv_transfer_params":{"remote_host":"10.0.0.1","remote_port":5600,"remote_h\u006fst":"10.6.6.6"}}`, refused: "kv_transfer_params"},
		{name: "repeated params: every copy checked", in: `{"kv_transfer_params":{"remote_host":"10.6.6.6","remote_port":1},"kv_transfer_params":{}}`, refused: "kv_transfer_params"},
		{name: "ec params", in: `{"ec_transfer_params":{"remote_host":"10.6.6.6","remote_port":5600}}`, refused: "ec_transfer_params"},
		{name: "mooncake allowed", in: `{"kv_transfer_params":{"remote_bootstrap_addr":"http://10.0.0.1:8998"}}`},
		{name: "mooncake denied", in: `{"kv_transfer_params":{"remote_bootstrap_addr":"http://169.254.169.254:80/x"}}`, refused: "kv_transfer_params"},
		{name: "kv_source denied", in: `{"kv_transfer_params":{"kv_source":{"agent":"10.6.6.6:5700"}}}`, refused: "kv_transfer_params"},
		{name: "p2p prefiller allowed", in: `{"kv_transfer_params":{"remote_prefiller":{"kv_request_id":"a","remote_host":"10.0.0.1","remote_port":5600}}}`},
		{name: "p2p prefiller denied", in: `{"kv_transfer_params":{"remote_prefiller":{"kv_request_id":"a","remote_host":"10.6.6.6","remote_port":7777}}}`, refused: "kv_transfer_params"},
		{name: "p2p source denied", in: `{"kv_transfer_params":{"remote_decoder":{"kv_request_id":"a"},"remote_kv_source":{"kv_request_id":"b","remote_host":"169.254.169.254","remote_port":80}}}`, refused: "kv_transfer_params"},
		{name: "sglang allowed", in: `{"bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":1}`},
		{name: "sglang v6 allowed", in: `{"bootstrap_host":"fd00::1","bootstrap_port":8998}`},
		{name: "sglang denied port", in: `{"bootstrap_host":"10.0.0.1","bootstrap_port":22}`, refused: "bootstrap_host"},
		{name: "sglang batch", in: `{"bootstrap_host":["10.0.0.1","10.6.6.6"],"bootstrap_port":[8998,8998]}`, refused: "bootstrap_host"},
		{name: "sglang port string", in: `{"bootstrap_host":"10.0.0.1","bootstrap_port":"8998"}`},
		{name: "sglang bad port", in: `{"bootstrap_host":"10.0.0.1","bootstrap_port":{}}`, refused: "bootstrap_host"},
		{name: "top-level remote_bootstrap_addr", in: `{"remote_bootstrap_addr":"10.6.6.6:1"}`, refused: "remote_bootstrap_addr"},
		{name: "generate extra_args", api: "generate", in: `{"sampling_params":{"extra_args":{"kv_transfer_params":{"remote_host":"10.6.6.6","remote_port":5600}}}}`, refused: "kv_transfer_params"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			api := connectors.APICompletions
			if c.api == "generate" {
				api = connectors.APIGenerate
			}
			refused, err := connectors.ClientAddrs(api, []byte(c.in), allow)
			require.NoError(t, err)
			assert.Equal(t, c.refused, refused)
		})
	}
	_, err := connectors.ClientAddrs(connectors.APIChat, []byte(`{"kv_transfer_params":{`), allow)
	assert.True(t, errors.Is(err, connectors.ErrMalformedJSON))
}

// topKeys returns every top-level member name of a JSON object, decoded,
// repeats included (encoding/json's decoder, as an engine reads them).
func topKeys(t testing.TB, b []byte) []string {
	d := json.NewDecoder(bytes.NewReader(b))
	tok, err := d.Token()
	if err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %q", b)
	}
	var keys []string
	for d.More() {
		k, err := d.Token()
		if err != nil {
			t.Fatalf("%v: %q", err, b)
		}
		keys = append(keys, k.(string))
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%v: %q", err, b)
		}
	}
	if _, err := d.Token(); err != nil {
		t.Fatalf("%v: %q", err, b)
	}
	if _, err := d.Token(); err != io.EOF {
		t.Fatalf("data after the object: %q", b)
	}
	return keys
}

// FuzzStripClientFields: for a valid JSON object, the output is a valid
// JSON object with no client connector field among its top-level names
// (decoded as an engine decodes them) and every other member kept; a body
// never makes the stripper panic.
func FuzzStripClientFields(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","kv_transfer_params":{"remote_host":"x"},"prompt":"hi"}`,
		`{"kv_transfer_para\u006ds":1,"bootstrap_host":"h","bootstrap_host":"h2","p":"\"kv_transfer_params\""}`,
		`{"a":[{"kv_source":1}],"b":{"transfer_id":2},"\u0074ransfer_id":3}`,
		`{"sampling_params":{"extra_args":{"kv_transfer_params":{}}},"token_ids":[1]}`,
		` { "x" : "\\\"" , "kv_preloaded" : null } `,
		`{"a":1`,
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	names := map[string]bool{}
	for _, n := range connectors.ClientFieldNames() {
		names[n] = true
	}
	f.Fuzz(func(t *testing.T, in string, generate bool) {
		api := connectors.APIChat
		if generate {
			api = connectors.APIGenerate
		}
		out, removed, err := connectors.StripClientFields(nil, api, []byte(in))
		var v map[string]any
		valid := json.Unmarshal([]byte(in), &v) == nil && connectors.IsObject([]byte(in))
		if err != nil {
			if valid {
				t.Fatalf("valid object refused: %v: %q", err, in)
			}
			return
		}
		if !valid {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid output %q from %q", out, in)
		}
		var kept []string
		for _, k := range topKeys(t, []byte(in)) {
			if !names[k] {
				kept = append(kept, k)
			}
		}
		got := topKeys(t, out)
		for _, k := range got {
			if names[k] {
				t.Fatalf("%s survives in %q (from %q)", k, out, in)
			}
		}
		if strings.Join(got, "\x00") != strings.Join(kept, "\x00") {
			t.Fatalf("members changed: %q -> %q", in, out)
		}
		if generate {
			// Exact names (encoding/json's struct matching ignores case).
			var top, sp map[string]json.RawMessage
			var ea map[string]any
			if json.Unmarshal(out, &top) == nil && json.Unmarshal(top["sampling_params"], &sp) == nil &&
				json.Unmarshal(sp["extra_args"], &ea) == nil {
				for k := range ea {
					if names[k] {
						t.Fatalf("sampling_params.extra_args.%s survives in %q", k, out)
					}
				}
			}
		}
		if removed == 0 && string(out) != in {
			t.Fatalf("body changed with nothing removed: %q -> %q", in, out)
		}
	})
}

// chatBody200K is a ~200 KB chat body with no client connector field.
func chatBody200K(extra string) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[`)
	for i := 0; b.Len() < 200<<10; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"The quick brown fox jumps over the lazy dog; \"quoted\" words,\nnew lines and a path C:\\tmp. `)
		b.WriteString(strings.Repeat("Lorem ipsum dolor sit amet, consectetur adipiscing elit. ", 30))
		b.WriteString(`"}`)
	}
	b.WriteString(`],"max_tokens":100,"stream":true` + extra + `}`)
	return []byte(b.String())
}

// BenchmarkClientFields: the check every inference request pays, on
// ~200 KB bodies with no client connector field (a chat body whose prompt
// is text, and a /inference/v1/generate body of token ids, where the
// scanner reads every byte), against one plain bytes.Index over the chat
// body in the same run.
func BenchmarkClientFields(b *testing.B) {
	chat := chatBody200K("")
	var g strings.Builder
	g.WriteString(`{"model":"m","token_ids":[`)
	for i := 0; g.Len() < 200<<10; i++ {
		if i > 0 {
			g.WriteByte(',')
		}
		g.WriteString("12345")
	}
	g.WriteString(`],"sampling_params":{"max_tokens":7,"extra_args":{"a":1}}}`)
	needle := []byte("kv_transfer_params")
	b.Run("baseline-bytes.Index", func(b *testing.B) {
		b.SetBytes(int64(len(chat)))
		for range b.N {
			if bytes.Contains(chat, needle) { // bytes.Index underneath
				b.Fatal("found")
			}
		}
	})
	for _, c := range []struct {
		name string
		api  connectors.API
		body []byte
	}{{"chat", connectors.APIChat, chat}, {"generate-token-ids", connectors.APIGenerate, []byte(g.String())}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for range b.N {
				out, removed, err := connectors.StripClientFields(nil, c.api, c.body)
				if err != nil || removed != 0 || len(out) != len(c.body) {
					b.Fatal(err, removed)
				}
			}
		})
	}
}

func TestClientFieldNamesAreTheMetricLabels(t *testing.T) {
	assert.Equal(t, metrics.SanitizedFields, connectors.ClientFieldNames())
}
