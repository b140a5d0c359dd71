package sidecar_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/sidecar"
)

func TestPrefillBodyAsksForASidecarPull(t *testing.T) {
	cases := []struct {
		name string
		api  connectors.API
		body string
		cap  string
	}{
		{"completions", connectors.APICompletions, `{"model":"m","prompt":"hi","max_tokens":9,"stream":true,"min_tokens":2}`, "max_tokens"},
		{"chat", connectors.APIChat, `{"model":"m","messages":[],"max_completion_tokens":9,"stream_options":{"include_usage":true}}`, "max_completion_tokens"},
		{"responses", connectors.APIResponses, `{"model":"m","input":"hi","max_output_tokens":9}`, "max_output_tokens"},
		{"generate", connectors.APIGenerate, `{"token_ids":[1,2],"sampling_params":{"max_tokens":9,"min_tokens":1}}`, "sampling_params.max_tokens"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := sidecar.New().PrefillBody(nil, tc.api, []byte(tc.body))
			require.NoError(t, err)
			js := string(out)
			assert.Equal(t, "sidecar", gjson.Get(js, "kv_transfer_params.pull_mode").String())
			assert.True(t, gjson.Get(js, "kv_transfer_params.do_remote_decode").Bool())
			assert.Equal(t, int64(1), gjson.Get(js, tc.cap).Int())
			assert.False(t, gjson.Get(js, "stream").Bool())
			assert.False(t, gjson.Get(js, "stream_options").Exists())
			assert.False(t, gjson.Get(js, "min_tokens").Exists())
		})
	}
}

const source = `{"agent":"10.0.0.9:5700","transport":"tcp","engine_id":"e1","request_id":"r1-ab","block_ids":[4,5],"block_bytes":4096,"num_tokens":20,"checksums":[1,2],"lease_ms":30000}`

func TestParsePrefill(t *testing.T) {
	cases := []struct {
		name   string
		answer string
		err    error
		done   bool
		source string
		tp     int
		cached int64
	}{
		{name: "kv source", answer: `{"choices":[{"finish_reason":"length","text":"x"}],"usage":{"prompt_tokens_details":{"cached_tokens":16}},"kv_transfer_params":{"do_remote_prefill":true,"tp_size":2,"kv_source":` + source + `}}`,
			source: source, tp: 2, cached: 16},
		{name: "eos on the first token", answer: `{"choices":[{"finish_reason":"stop","text":""}],"kv_transfer_params":null}`, done: true},
		{name: "cap without params", answer: `{"choices":[{"finish_reason":"length","text":"x"}]}`, err: connectors.ErrNoKVParams},
		{name: "nixl params without kv_source", answer: `{"choices":[{"finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"h"}}`, err: connectors.ErrInvalidKVParams},
		{name: "not an object", answer: `[1]`, err: connectors.ErrBadPrefillAnswer},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := sidecar.New().ParsePrefill(connectors.APICompletions, []byte(tc.answer))
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.done, h.Done)
			assert.Equal(t, tc.tp, h.TPSize)
			assert.Equal(t, tc.cached, h.CachedTokens)
			if tc.source != "" {
				assert.JSONEq(t, tc.source, string(h.Params))
			}
		})
	}
}

func TestDecodeBodyNamesPreloadedBlocksOnly(t *testing.T) {
	c := sidecar.New()
	h, err := c.ParsePrefill(connectors.APICompletions, []byte(`{"choices":[{"finish_reason":"length"}],"kv_transfer_params":{"kv_source":`+source+`}}`))
	require.NoError(t, err)
	raw, err := c.KVSource(h)
	require.NoError(t, err)
	assert.JSONEq(t, source, string(raw))

	body := []byte(`{"model":"m","prompt":"hi","max_tokens":9,"stream":true}`)
	_, err = c.DecodeBody(nil, connectors.APICompletions, body, h)
	require.ErrorIs(t, err, connectors.ErrInvalidKVParams, "a kv_source handoff is not decodable: nobody pulled it")

	h, err = c.Preloaded(h, sidecar.Preloaded{AllocID: "alloc-1", BlockIDs: []int{7, 8}, NumTokens: 20})
	require.NoError(t, err)
	out, err := c.DecodeBody(nil, connectors.APICompletions, body, h)
	require.NoError(t, err)
	js := string(out)
	assert.Equal(t, "alloc-1", gjson.Get(js, "kv_transfer_params.kv_preloaded.alloc_id").String())
	assert.Equal(t, `[7,8]`, gjson.Get(js, "kv_transfer_params.kv_preloaded.block_ids").Raw)
	assert.Equal(t, int64(20), gjson.Get(js, "kv_transfer_params.kv_preloaded.num_tokens").Int())
	assert.True(t, gjson.Get(js, "kv_transfer_params.do_remote_prefill").Bool())
	assert.Equal(t, int64(9), gjson.Get(js, "max_tokens").Int(), "the client's own fields")
	assert.True(t, gjson.Get(js, "stream").Bool())
}

func TestParsePrefillReadsOnlyTheDocumentedSource(t *testing.T) {
	answer := func(src string) []byte {
		return []byte(`{"choices":[{"finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"kv_source":` + src + `}}`)
	}
	h, err := sidecar.New().ParsePrefill(connectors.APICompletions, answer(source))
	require.NoError(t, err)
	assert.Equal(t, source, string(h.Params), "written anew, in the documented order")
	assert.Equal(t, []connectors.Addr{{Field: "kv_source.agent", Host: "10.0.0.9", Port: 5700}}, h.Addrs)
	for name, src := range map[string]string{
		"extra member":        `{"agent":"10.0.0.9:5700","transport":"tcp","engine_id":"e","request_id":"r","block_ids":[1],"block_bytes":1,"num_tokens":1,"remote_host":"10.9.9.9"}`,
		"agent without port":  `{"agent":"10.0.0.9","transport":"tcp","engine_id":"e","request_id":"r","block_ids":[1],"block_bytes":1,"num_tokens":1}`,
		"agent port 0":        `{"agent":"10.0.0.9:0","transport":"tcp","engine_id":"e","request_id":"r","block_ids":[1],"block_bytes":1,"num_tokens":1}`,
		"agent with a path":   `{"agent":"10.0.0.9:5700/x","transport":"tcp","engine_id":"e","request_id":"r","block_ids":[1],"block_bytes":1,"num_tokens":1}`,
		"checksum not uint64": `{"agent":"10.0.0.9:5700","transport":"tcp","engine_id":"e","request_id":"r","block_ids":[1],"block_bytes":1,"num_tokens":1,"checksums":[-1]}`,
		"agent twice":         `{"agent":"10.0.0.9:5700","agent":"10.9.9.9:1","transport":"tcp","engine_id":"e","request_id":"r","block_ids":[1],"block_bytes":1,"num_tokens":1}`,
	} {
		_, err := sidecar.New().ParsePrefill(connectors.APICompletions, answer(src))
		assert.ErrorIs(t, err, connectors.ErrInvalidKVParams, name)
	}
	_, err = sidecar.New().ParsePrefill(connectors.APICompletions,
		[]byte(`{"choices":[{"finish_reason":"length"}],"kv_transfer_params":{"kv_source":`+source+`,"remote_bootstrap_addr":"x"}}`))
	assert.ErrorIs(t, err, connectors.ErrInvalidKVParams, "an undocumented member beside kv_source")
}
