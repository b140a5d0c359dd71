package nixlv2_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
)

// answerWith is a length-capped completion answer carrying params.
func answerWith(params string) []byte {
	return []byte(`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":` + params + `}`)
}

// TestParsePrefillHandsOnOnlyDocumentedFields: whatever a prefiller
// answers, the decode leg's params hold the documented members only, each
// of its type and within bounds, written anew; anything else is refused.
func TestParsePrefillHandsOnOnlyDocumentedFields(t *testing.T) {
	base := `"do_remote_prefill":true,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_host":"10.0.0.9","remote_port":5600`
	deep := strings.Repeat(`[`, 100000) + strings.Repeat(`]`, 100000)
	tests := []struct {
		name   string
		params string
		want   string // "" = refused
	}{
		{"minimal", `{` + base + `}`, `{` + base + `}`},
		{"members in vLLM's order", `{"tp_size":1,"remote_port":5600,"remote_host":"10.0.0.9","remote_engine_id":"e","remote_block_ids":[1],"do_remote_prefill":true}`,
			`{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"10.0.0.9","remote_port":5600,"tp_size":1}`},
		{"blanks dropped", "{ \"do_remote_prefill\" : true ,\n\"remote_block_ids\":[ [ 1 , 2 ] ],\"remote_engine_id\":\"e\",\"remote_host\":\"10.0.0.9\",\"remote_port\": 5600 }", `{` + base + `}`},
		{"optional null kept", `{` + base + `,"remote_request_id":null}`,
			`{"do_remote_prefill":true,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_request_id":null,"remote_host":"10.0.0.9","remote_port":5600}`},
		{"remote_num_tokens", `{` + base + `,"remote_num_tokens":40}`, `{` + base + `,"remote_num_tokens":40}`},
		{"ipv6 host", `{"do_remote_prefill":true,"remote_block_ids":[],"remote_engine_id":"e","remote_host":"fd00::9","remote_port":5600}`,
			`{"do_remote_prefill":true,"remote_block_ids":[],"remote_engine_id":"e","remote_host":"fd00::9","remote_port":5600}`},
		{"dns host", `{"do_remote_prefill":true,"remote_block_ids":[],"remote_engine_id":"e","remote_host":"prefill-0.pool.svc","remote_port":5600}`,
			`{"do_remote_prefill":true,"remote_block_ids":[],"remote_engine_id":"e","remote_host":"prefill-0.pool.svc","remote_port":5600}`},

		{"extra field", `{` + base + `,"remote_bootstrap_addr":"http://10.9.9.9:8998"}`, ""},
		{"kv_source smuggled", `{` + base + `,"kv_source":{"agent":"10.9.9.9:1"}}`, ""},
		{"deep value", `{` + base + `,"x":` + deep + `}`, ""},
		{"deep block ids", `{"do_remote_prefill":true,"remote_block_ids":` + deep + `,"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"duplicated host", `{` + base + `,"remote_host":"10.9.9.9"}`, ""},
		{"escaped name", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote\u005fhost":"10.9.9.9","remote_host":"10.0.0.9","remote_port":1}`, ""},
		{"port 0", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h","remote_port":0}`, ""},
		{"port 65536", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h","remote_port":65536}`, ""},
		{"port as a string", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h","remote_port":"5600"}`, ""},
		{"port with a fraction", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h","remote_port":5600.0}`, ""},
		{"host with a path", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h/x","remote_port":1}`, ""},
		{"host with a port", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"10.0.0.9:22","remote_port":1}`, ""},
		{"host with a zone", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"fe80::1%eth0","remote_port":1}`, ""},
		{"engine id with a control character", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e\u0000","remote_host":"h","remote_port":1}`, ""},
		{"engine id too long", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"` + strings.Repeat("e", 257) + `","remote_host":"h","remote_port":1}`, ""},
		{"the largest block id", `{"do_remote_prefill":true,"remote_block_ids":[2147483647, 0],"remote_engine_id":"e","remote_host":"h","remote_port":1}`,
			`{"do_remote_prefill":true,"remote_block_ids":[2147483647,0],"remote_engine_id":"e","remote_host":"h","remote_port":1}`},
		{"empty groups", `{"do_remote_prefill":true,"remote_block_ids":[[],[ 3 ]],"remote_engine_id":"e","remote_host":"h","remote_port":1}`,
			`{"do_remote_prefill":true,"remote_block_ids":[[],[3]],"remote_engine_id":"e","remote_host":"h","remote_port":1}`},
		{"a block id past int32", `{"do_remote_prefill":true,"remote_block_ids":[2147483648],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"a block id with an exponent", `{"do_remote_prefill":true,"remote_block_ids":[1e3],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"placeholder block ids", `{"do_remote_prefill":true,"remote_block_ids":["DUMMY_ID", "1"],"remote_engine_id":"e","remote_host":"h","remote_port":1}`,
			`{"do_remote_prefill":true,"remote_block_ids":["DUMMY_ID","1"],"remote_engine_id":"e","remote_host":"h","remote_port":1}`},
		{"placeholders and ids mixed", `{"do_remote_prefill":true,"remote_block_ids":["DUMMY_ID",1],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"ids and placeholders mixed", `{"do_remote_prefill":true,"remote_block_ids":[1,"DUMMY_ID"],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"placeholders in groups", `{"do_remote_prefill":true,"remote_block_ids":[["DUMMY_ID"]],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"a placeholder with an escape", `{"do_remote_prefill":true,"remote_block_ids":["a\u0041"],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"a placeholder with a space", `{"do_remote_prefill":true,"remote_block_ids":["a b"],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"an empty placeholder", `{"do_remote_prefill":true,"remote_block_ids":[""],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"an undocumented scalar", `{` + base + `,"kv_layout_version":3,"fast_path":true,"mode":"HND_V2","note":null}`,
			`{` + base + `,"kv_layout_version":3,"fast_path":true,"mode":"HND_V2","note":null}`},
		{"an undocumented array of numbers", `{` + base + `,"layer_offsets":[0, 1.5,-2]}`, `{` + base + `,"layer_offsets":[0,1.5,-2]}`},
		{"an undocumented string re-quoted", `{` + base + `,"tag":"a\u0042\"c"}`, `{` + base + `,"tag":"aB\"c"}`},
		{"an undocumented IP", `{` + base + `,"peer":"10.9.9.9"}`, ""},
		{"an undocumented short IP", `{` + base + `,"peer":"10.1"}`, ""},
		{"an undocumented decimal IP", `{` + base + `,"peer":"2130706433"}`, ""},
		{"an undocumented hex IP", `{` + base + `,"peer":"0x7f000001"}`, ""},
		{"an undocumented IPv6", `{` + base + `,"peer":"fd00::9"}`, ""},
		{"an undocumented name", `{` + base + `,"peer":"prefill-1.pool.svc"}`, ""},
		{"an undocumented single label", `{` + base + `,"peer":"localhost"}`, ""},
		{"an undocumented host:port", `{` + base + `,"peer":"x_y:80"}`, ""},
		{"an undocumented URL", `{` + base + `,"peer":"http://x_y"}`, ""},
		{"an undocumented userinfo", `{` + base + `,"peer":"a_b@c_d"}`, ""},
		{"an undocumented padded IP", `{` + base + `,"peer":" 10.9.9.9 "}`, ""},
		{"an undocumented IP with a NUL", `{` + base + `,"peer":"10.9.9.9\u0000x_"}`, ""},
		{"an undocumented IP in an array", `{` + base + `,"peers":[1,"10.9.9.9"]}`, ""},
		{"an undocumented IP in an object", `{` + base + `,"peers":{"a":{"b":"10.9.9.9"}}}`, ""},
		{"an undocumented escaped name", `{` + base + `,"p\u0065er":1}`, ""},
		{"an undocumented name that is not an identifier", `{` + base + `,"pe-er":1}`, ""},
		{"an undocumented member twice", `{` + base + `,"x_y":1,"x_y":2}`, ""},
		{"an undocumented object with a name twice", `{` + base + `,"x_y":{"a":1,"a":2}}`, ""},
		{"too many undocumented members", `{` + base + strings.Repeat(`,"a_`, 1) + manyMembers(17) + `}`, ""},
		{"ascend node map", `{` + base + `,"remote_multi_nodes_meta_mapping":{"0":{"host":"10.0.0.9","engine_id":"0","handshake_port":30000}}}`,
			`{` + base + `,"remote_multi_nodes_meta_mapping":{"0":{"host":"10.0.0.9","engine_id":"0","handshake_port":30000}}}`},
		{"ascend node map keyed by a name", `{` + base + `,"remote_multi_nodes_meta_mapping":{"a":{"host":"10.0.0.9","engine_id":"0","handshake_port":30000}}}`, ""},
		{"ascend node with an extra member", `{` + base + `,"remote_multi_nodes_meta_mapping":{"0":{"host":"10.0.0.9","engine_id":"0","handshake_port":30000,"x":1}}}`, ""},
		{"too many KV-cache groups", `{"do_remote_prefill":true,"remote_block_ids":[` + strings.Repeat("[],", 64) + `[]],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"negative block id", `{"do_remote_prefill":true,"remote_block_ids":[-1],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"block ids mixed", `{"do_remote_prefill":true,"remote_block_ids":[1,[2]],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"block ids three deep", `{"do_remote_prefill":true,"remote_block_ids":[[[1]]],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"too many block ids", `{"do_remote_prefill":true,"remote_block_ids":[` + strings.Repeat("1,", nixlv2.MaxBlockIDs) + `1],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"tp_size 0", `{` + base + `,"tp_size":0}`, ""},
		{"do_remote_prefill false", `{"do_remote_prefill":false,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h","remote_port":1}`, ""},
		{"required null", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":null,"remote_port":1}`, ""},
		{"malformed", `{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h","remote_port":1,}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := nixlv2.New().ParsePrefill(connectors.APICompletions, answerWith(tt.params))
			if tt.want == "" {
				require.ErrorIs(t, err, connectors.ErrInvalidKVParams)
				assert.NotContains(t, err.Error(), "10.9.9.9", "the reason quotes nothing of the answer")
				assert.Nil(t, h.Params)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(h.Params))
			require.NotEmpty(t, h.Addrs)
			assert.Equal(t, "kv_transfer_params.remote_host", h.Addrs[len(h.Addrs)-1].Field)
		})
	}
}

// manyMembers is n undocumented members, the first without its name's
// start (the caller's `,"a_`).
func manyMembers(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(`,"a_`)
		}
		fmt.Fprintf(&b, `%d":%d`, i, i)
	}
	return b.String()
}

func TestReleaseBodyCarriesTheReadParams(t *testing.T) {
	c := nixlv2.New()
	h, err := c.ParsePrefill(connectors.APIChat, answerWith(goodParams))
	require.NoError(t, err)
	out, err := c.ReleaseBody(nil, connectors.APIChat, []byte(`{"messages":[],"kv_transfer_params":{"remote_host":"10.9.9.9"}}`), h)
	require.NoError(t, err)
	assert.Contains(t, string(out), `"kv_transfer_params":`+goodParams)
	assert.NotContains(t, string(out), "10.9.9.9")
}
