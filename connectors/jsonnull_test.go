package connectors_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

func TestNullMembers(t *testing.T) {
	const p = `{"remote_host":"10.0.0.9","remote_port":5600,"remote_block_ids":[[1,2]]}`
	cases := []struct {
		name, in, want string
		n              int // values nulled; -1: malformed
	}{
		{"absent", `{"a":1}`, `{"a":1}`, 0},
		{"already null", `{"a":1,"kv_transfer_params":null}`, `{"a":1,"kv_transfer_params":null}`, 0},
		{"one", `{"a":1,"kv_transfer_params":` + p + `}`, `{"a":1,"kv_transfer_params":null}`, 1},
		{"blanks kept", "{ \"kv_transfer_params\" :\n " + p + " ,\"b\":2}", "{ \"kv_transfer_params\" :\n null ,\"b\":2}", 1},
		{"null first, then the params (a parser takes the last)", `{"kv_transfer_params":null,"a":1,"kv_transfer_params":` + p + `}`,
			`{"kv_transfer_params":null,"a":1,"kv_transfer_params":null}`, 1},
		{"every copy", `{"kv_transfer_params":` + p + `,"kv_transfer_params":"x"}`, `{"kv_transfer_params":null,"kv_transfer_params":null}`, 2},
		{"escaped name", `{"kv\u005ftransfer_params":` + p + `}`, `{"kv\u005ftransfer_params":null}`, 1},
		{"escaped name, upper-case hex", `{"\u006B\u0076_transfer_params":1}`, `{"\u006B\u0076_transfer_params":null}`, 1},
		{"nested (a Responses API event)", `{"type":"response.completed","response":{"id":"r","kv_transfer_params":` + p + `}}`,
			`{"type":"response.completed","response":{"id":"r","kv_transfer_params":null}}`, 1},
		{"in an array", `[{"kv_transfer_params":1},{"b":[{"kv_transfer_params":{}}]}]`, `[{"kv_transfer_params":null},{"b":[{"kv_transfer_params":null}]}]`, 2},
		{"inside params nulled whole", `{"kv_transfer_params":{"kv_transfer_params":` + p + `}}`, `{"kv_transfer_params":null}`, 1},
		{"a string that says it", `{"text":"\"kv_transfer_params\":{}"}`, `{"text":"\"kv_transfer_params\":{}"}`, 0},
		{"another name", `{"kv_transfer_paramsX":1,"KV_transfer_params":2}`, `{"kv_transfer_paramsX":1,"KV_transfer_params":2}`, 0},
		{"an engine's NaN", `{"logprob":-Infinity,"x":NaN,"kv_transfer_params":1}`, `{"logprob":-Infinity,"x":NaN,"kv_transfer_params":null}`, 1},
		{"a scalar", `"kv_transfer_params"`, `"kv_transfer_params"`, 0},
		{"cut short", `{"kv_transfer_params":`, "", -1},
		{"two values", `{"a":1}{"kv_transfer_params":1}`, "", -1},
		{"a line of an event cut in two", `{"a":1,"kv_transfer_params":`, "", -1},
		{"bad structure", `{"kv_transfer_params":1,}`, "", -1},
		{"too deep", strings.Repeat("[", 600) + strings.Repeat("]", 600), "", -1},
		{"params nested deep, nulled whole", `{"a":1,"kv_transfer_params":{"x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}}`, `{"a":1,"kv_transfer_params":null}`, 1},
		{"params nested deep, unbalanced", `{"kv_transfer_params":` + strings.Repeat("[", 1000) + `}`, "", -1},
		{"deep enough", strings.Repeat("[", 500) + `{"kv_transfer_params":1}` + strings.Repeat("]", 500),
			strings.Repeat("[", 500) + `{"kv_transfer_params":null}` + strings.Repeat("]", 500), 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.in)
			out, n, err := connectors.NullMembers(nil, in, "kv_transfer_params")
			if tc.n < 0 {
				require.ErrorIs(t, err, connectors.ErrMalformedJSON)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.n, n)
			assert.Equal(t, tc.want, string(out))
			if n == 0 {
				assert.Same(t, &in[0], &out[0], "no copy")
			}
			// What a JSON parser reads: the member, wherever it is, is null or absent.
			var v any
			if json.Unmarshal(out, &v) == nil {
				assert.NotContains(t, findParams(v), "non-null", tc.name)
			}
		})
	}
}

// findParams lists, for every kv_transfer_params a parser reads in v,
// "null" or "non-null".
func findParams(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if k == "kv_transfer_params" {
				if e == nil {
					out = append(out, "null")
				} else {
					out = append(out, "non-null")
				}
				continue
			}
			out = append(out, findParams(e)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, findParams(e)...)
		}
	}
	return out
}
