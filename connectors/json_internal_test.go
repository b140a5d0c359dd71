package connectors

import (
	"bytes"
	"strings"
	"testing"
)

var editsForDiff = []Edit{
	{Key: "stream", Raw: []byte("false")}, {Key: "min_tokens", Delete: true}, {Key: "max_tokens", Raw: []byte("1")},
	{Key: "kv_transfer_params", Raw: []byte(`{"do_remote_decode":true}`)},
	{Key: "sampling_params", Nested: []Edit{{Key: "max_tokens", Raw: []byte("1")}, {Key: "min_tokens", Delete: true}}},
}

// FuzzEditObjectScan: on a well-formed object (every body the sidecar edits
// was validated: ScanBody), EditObject's walk with scanObject gives, byte
// for byte, what its walk with gjson gave; on any other input it does not
// panic (gjson's guesses at a malformed one are not kept).
func FuzzEditObjectScan(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi \"there\""}],"stream":true,"max_tokens":9}`,
		`{"min_tokens":1,"sampling_params":{"max_tokens":5,"min_tokens":2},"prompt":[1,2,3]}`,
		`{"str\u0065am":true,"m\u0069n_tokens":3}`, ` { "a" : 1 , "stream" : null } `, `{"a":1,}`, `{"a":`, `{}`, `{"a":{"b":[{}]}} x`,
		`{"` + strings.Repeat("n", 80) + `":1,"stream":true}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		want, werr := editObject(nil, body, editsForDiff, false)
		got, gerr := editObject([]byte("prefix"), body, editsForDiff, true)
		if ValidObject(body) != nil {
			return
		}
		if (werr == nil) != (gerr == nil) || !bytes.Equal(want, got[len("prefix"):]) {
			t.Fatalf("body %q:\n scan  %q %v\n gjson %q %v", body, got, gerr, want, werr)
		}
	})
}
