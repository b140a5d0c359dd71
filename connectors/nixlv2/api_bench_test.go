package nixlv2_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
)

// apiBody returns a body of about size bytes for api, its prompt in the
// field that API uses.
func apiBody(api connectors.API, size int) []byte {
	text := strings.Repeat("lorem ipsum dolor sit amet ", max(1, size/27))
	switch api {
	case connectors.APIChat:
		return chatBody(size)
	case connectors.APIResponses:
		return []byte(`{"model":"m","stream":true,"max_output_tokens":64,"input":"` + text + `"}`)
	case connectors.APIMessages:
		return []byte(`{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"` + text + `"}]}`)
	case connectors.APIGenerate:
		ids := strings.Repeat("12345,", max(1, size/6))
		return []byte(`{"model":"m","stream":true,"sampling_params":{"max_tokens":64,"min_tokens":2},"token_ids":[` + ids + `1]}`)
	}
	return []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"min_tokens":2,"prompt":"` + text + `"}`)
}

// BenchmarkPrefillRewritePerAPI is the nixlv2 prefill rewrite for every
// inference API at 1 KiB, 10 KiB, 100 KiB and 1 MiB: allocs/op must not
// grow with the body.
func BenchmarkPrefillRewritePerAPI(b *testing.B) {
	apis := []connectors.API{connectors.APICompletions, connectors.APIChat, connectors.APIResponses, connectors.APIMessages, connectors.APIGenerate}
	for _, api := range apis {
		for _, size := range []int{1 << 10, 10 << 10, 100 << 10, 1 << 20} {
			body := apiBody(api, size)
			b.Run(fmt.Sprintf("%s/%dKiB", strings.TrimPrefix(api.String(), "/"), size>>10), func(b *testing.B) {
				c := nixlv2.New()
				dst := make([]byte, 0, len(body)+512)
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					var err error
					if dst, err = c.PrefillBody(dst, api, body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkRewriteAnswer is the cached_tokens rewrite of one SSE usage chunk
// and of one token chunk (which has no usage and must stay untouched).
func BenchmarkRewriteAnswer(b *testing.B) {
	c := nixlv2.New()
	h := connectors.Handoff{CachedTokens: 16}
	cases := map[string][]byte{
		"usage-chunk": []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":128,"completion_tokens":16,"total_tokens":144,"prompt_tokens_details":{"cached_tokens":128}}}`),
		"token-chunk": []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null}]}`),
	}
	for name, data := range cases {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = c.RewriteAnswer(connectors.APIChat, data, h)
			}
		})
	}
}
