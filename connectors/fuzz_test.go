package connectors_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/mooncake"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/connectors/sglang"
	"github.com/pd-sidecar/pd-sidecar/connectors/sharedstorage"
	"github.com/pd-sidecar/pd-sidecar/connectors/sidecar"
)

// Every connector, as cmd/pd-sidecar registers them.
func allConnectors() []connectors.Connector {
	return []connectors.Connector{nixlv2.New(), sglang.New(8998), mooncake.New(8998), sharedstorage.New(), sidecar.New()}
}

// legFields are the only top-level members a connector may change on a
// leg; every other member must reach the engine byte for byte.
var legFields = map[string]bool{
	"stream": true, "stream_options": true, "max_tokens": true, "max_completion_tokens": true,
	"max_output_tokens": true, "sampling_params": true, "min_tokens": true, "min_completion_tokens": true,
	"kv_transfer_params": true, "bootstrap_host": true, "bootstrap_port": true, "bootstrap_room": true,
	"cache_hit_threshold": true,
}

var apis = []connectors.API{connectors.APICompletions, connectors.APIChat, connectors.APIResponses, connectors.APIMessages, connectors.APIGenerate}

const prefillAnswer = `{"id":"x","choices":[{"text":"a","finish_reason":"length"}],"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":1}},` +
	`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_request_id":"r","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}}`

func seedBodies(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":"hi \"there\""}],"max_completion_tokens":7,"min_tokens":2,"temperature":0.5}`,
		`{"model":"m","input":"x","max_output_tokens":9,"metadata":{"a":[1,2,{"b":null}]}}`,
		`{"model":"m","token_ids":[1,2,3],"sampling_params":{"max_tokens":4,"min_tokens":1}}`,
		`{"model":"m","prompt":"x","kv_transfer_params":{"evil":true},"cache_hit_threshold":0.5}`,
		`{"a":1,"a":2}`, `{}`, `[]`, `{"model":"m","prompt":"\u00e9\ud83d\ude00"}`, `  {"x" : { } }  `, `{"x":`, `nul`,
	} {
		f.Add([]byte(s), uint8(0))
	}
}

// checkLeg verifies one leg built from a valid body: valid JSON, and every
// member outside legFields unchanged.
func checkLeg(t *testing.T, name string, in, out []byte) {
	t.Helper()
	if !json.Valid(out) || !gjson.ParseBytes(out).IsObject() {
		t.Fatalf("%s: leg is not a JSON object: %q from %q", name, out, in)
	}
	gjson.ParseBytes(in).ForEach(func(k, v gjson.Result) bool {
		if legFields[k.Str] {
			return true
		}
		got := gjson.GetBytes(out, gjson.Escape(k.Str))
		if !got.Exists() || !bytes.Equal([]byte(got.Raw), []byte(v.Raw)) && !jsonEqual(got.Raw, v.Raw) {
			t.Fatalf("%s: member %q changed: %s -> %s (body %q)", name, k.Str, v.Raw, got.Raw, in)
		}
		return true
	})
}

func jsonEqual(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil &&
		bytes.Equal(mustJSON(x), mustJSON(y))
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// valid reports whether body is a JSON object without duplicate keys at
// the top level (duplicates are ambiguous, engines disagree on them).
func valid(body []byte) bool {
	if !json.Valid(body) || !gjson.ParseBytes(body).IsObject() {
		return false
	}
	seen := map[string]bool{}
	dup := false
	gjson.ParseBytes(body).ForEach(func(k, _ gjson.Result) bool {
		dup = dup || seen[k.Str]
		seen[k.Str] = true
		return !dup
	})
	return !dup
}

// FuzzConnectorLegs rewrites arbitrary bodies with every connector on every
// API: no panic, and a valid body gives valid legs with only the intended
// members changed.
func FuzzConnectorLegs(f *testing.F) {
	seedBodies(f)
	f.Fuzz(func(t *testing.T, body []byte, apiSel uint8) {
		api := apis[int(apiSel)%len(apis)]
		ok := valid(body)
		orig := append([]byte(nil), body...)
		for _, c := range allConnectors() {
			if s, isSeq := c.(connectors.Sequential); isSeq {
				pre, err := s.PrefillBody(nil, api, body)
				if err == nil && ok {
					checkLeg(t, c.Name()+" prefill", body, pre)
				}
				h, herr := s.ParsePrefill(api, []byte(prefillAnswer))
				if herr == nil {
					dec, err := s.DecodeBody(nil, api, body, h)
					if err == nil && ok {
						checkLeg(t, c.Name()+" decode", body, dec)
					}
				}
				if rw, isRW := c.(connectors.AnswerRewriter); isRW {
					_ = rw.RewriteAnswer(api, body, h)
				}
			}
			if cc, isCC := c.(connectors.Concurrent); isCC {
				pre, dec, err := cc.Legs(api, body, connectors.Pairing{PrefillHost: "10.0.0.1", Room: 42, TransferID: "xfer-1",
					Bootstrap: connectors.Bootstrap{URL: "http://10.0.0.1:8998", EngineID: "e"}})
				if err == nil && ok {
					checkLeg(t, c.Name()+" prefill", body, pre)
					checkLeg(t, c.Name()+" decode", body, dec)
				}
			}
			if !bytes.Equal(orig, body) {
				t.Fatalf("%s modified the client body", c.Name())
			}
		}
	})
}

// FuzzEditObject: the in-place JSON editor never panics, and on a valid
// object sets, deletes and keeps members as asked.
func FuzzEditObject(f *testing.F) {
	seedBodies(f)
	f.Fuzz(func(t *testing.T, body []byte, _ uint8) {
		out, err := connectors.EditObject(nil, body, []connectors.Edit{
			{Key: "stream", Raw: []byte("false")}, {Key: "min_tokens", Delete: true},
			{Key: "sampling_params", Nested: []connectors.Edit{{Key: "max_tokens", Raw: []byte("1")}}},
		})
		if err != nil || !valid(body) {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON %q from %q", out, body)
		}
		if gjson.GetBytes(out, "stream").Raw != "false" || gjson.GetBytes(out, "min_tokens").Exists() {
			t.Fatalf("edits not applied: %q", out)
		}
	})
}

// FuzzClassifyEvent: SSE payload classification never panics.
func FuzzClassifyEvent(f *testing.F) {
	for _, s := range []string{`[DONE]`, `{"choices":[{"delta":{"role":"assistant","content":""}}]}`, `{"error":{"code":500}}`, `{"type":"message_start"}`, `x`} {
		f.Add([]byte(s), uint8(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, apiSel uint8) {
		_ = connectors.ClassifyEvent(apis[int(apiSel)%len(apis)], data)
		_, _ = connectors.Finished(apis[int(apiSel)%len(apis)], data)
	})
}
