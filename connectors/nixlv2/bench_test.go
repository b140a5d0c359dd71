package nixlv2_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
)

// chatBody returns a chat request of about size bytes spread over many
// messages, the shape a long multi-turn conversation has.
func chatBody(size int) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"sim-model","stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"min_tokens":4,"messages":[`)
	turn := `{"role":"user","content":"` + strings.Repeat("lorem ipsum dolor sit amet \\\"quoted\\\" ", 25) + `"}`
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(turn)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// mapPrefill is the baseline: what a proxy that unmarshals the body into a
// map and marshals it back does for the same prefill rewrite.
func mapPrefill(body []byte) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	m["stream"] = false
	delete(m, "stream_options")
	delete(m, "min_tokens")
	delete(m, "min_completion_tokens")
	m["max_tokens"] = 1
	m["max_completion_tokens"] = 1
	m["kv_transfer_params"] = map[string]any{
		"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
	}
	return json.Marshal(m)
}

// BenchmarkPrefillRewrite compares the in-place nixlv2 prefill rewrite of a
// 100 KiB chat body with the encoding/json map round trip.
func BenchmarkPrefillRewrite(b *testing.B) {
	body := chatBody(100 << 10)
	b.Run("nixlv2-inplace", func(b *testing.B) {
		c := nixlv2.New()
		dst := make([]byte, 0, len(body)+512)
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if dst, err = c.PrefillBody(dst, connectors.APIChat, body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json-map", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := mapPrefill(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecodeRewrite measures the decode leg's body (params copied in).
func BenchmarkDecodeRewrite(b *testing.B) {
	body := chatBody(100 << 10)
	h := connectors.Handoff{Params: []byte(goodParams)}
	c := nixlv2.New()
	dst := make([]byte, 0, len(body)+512)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = c.DecodeBody(dst, connectors.APIChat, body, h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParsePrefill measures reading a prefill answer's handoff: the
// params checked against Params and written anew (vLLM's shape, two
// KV-cache groups of n blocks each).
func BenchmarkParsePrefill(b *testing.B) {
	b.Run("engine-sim-18-blocks", func(b *testing.B) {
		// engine-sim's answer to a 128-word chat prompt, as the suite's
		// P/D runs read it.
		answer := []byte(`{"choices":[{"finish_reason":"length","index":0,"logprobs":null,"message":{"content":" coja","role":"assistant","tool_calls":[]},"stop_reason":null}],"created":1796694124,"id":"chatcmpl-32f7c4a0239c8311b97ea9f935797653",` +
			`"kv_transfer_params":{"dcp_size":1,"do_remote_decode":false,"do_remote_prefill":true,"pp_size":1,"remote_block_ids":[[53,52,51,50,49,48,47,46,45],[44,43,42,41,40,39,38,37,36]],"remote_blocks_expiry_time":null,"remote_engine_id":"b563d684c2be5726","remote_host":"127.0.0.1","remote_num_tokens":138,"remote_port":19002,"remote_request_id":"32f7c4a0239c8311b97ea9f935797653-09e32f89","tp_size":1,"transfer_mode":"pull"},` +
			`"model":"sim-model","object":"chat.completion","prompt_logprobs":null,"usage":{"completion_tokens":1,"prompt_tokens":138,"prompt_tokens_details":{"cached_tokens":0},"total_tokens":139}}`)
		c := nixlv2.New()
		b.SetBytes(int64(len(answer)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.ParsePrefill(connectors.APIChat, answer); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, n := range []int{64, 32768} {
		ids := strings.TrimSuffix(strings.Repeat("1234,", n), ",")
		answer := []byte(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a","logprobs":null,"finish_reason":"length"}],` +
			`"usage":{"prompt_tokens":1024,"total_tokens":1025,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}},` +
			`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[` + ids + `],[` + ids + `]],` +
			`"remote_engine_id":"5f0c9a3e-1b2d-4e6f-8a7b-9c0d1e2f3a4b","remote_request_id":"cmpl-0123456789abcdef0123456789abcdef-0-1a2b3c4d",` +
			`"remote_host":"10.0.0.9","remote_port":5600,"tp_size":1}}`)
		b.Run(strconv.Itoa(2*n)+"-blocks", func(b *testing.B) {
			c := nixlv2.New()
			b.SetBytes(int64(len(answer)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.ParsePrefill(connectors.APICompletions, answer); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
