package core

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/sserelay"
)

// sseStream is a chat stream of n token events, a usage chunk and [DONE].
func sseStream(n int) []byte {
	var b bytes.Buffer
	b.WriteString("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n")
	for i := range n {
		fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok%d\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", i)
	}
	b.WriteString("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":128,\"completion_tokens\":16,\"total_tokens\":144,\"prompt_tokens_details\":{\"cached_tokens\":128}}}\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

// benchEvents runs each event of a 16-token stream through perEvent, the
// stream re-read from memory on every iteration.
func benchEvents(b *testing.B, perEvent func(ev []byte)) {
	stream := sseStream(16)
	rd := bytes.NewReader(stream)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(stream)
		er := sse.NewReader(rd, nil, 0)
		for {
			ev, err := er.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			perEvent(ev)
		}
	}
}

// BenchmarkSSEScan splits a 16-token stream into events and classifies
// each, as the decode relay does.
func BenchmarkSSEScan(b *testing.B) {
	benchEvents(b, func(ev []byte) {
		if d := sse.FirstData(ev); d != nil {
			_ = connectors.ClassifyEvent(connectors.APIChat, d)
		}
	})
}

// BenchmarkSSERewrite is the per-event relay work of a disaggregated
// stream: scan, and rewrite cached_tokens in each data payload.
func BenchmarkSSERewrite(b *testing.B) {
	rw, ok := connectors.Connector(nixlv2.New()).(connectors.AnswerRewriter)
	if !ok {
		b.Fatal("nixlv2 rewrites answers")
	}
	h := connectors.Handoff{CachedTokens: 16}
	fn := func(d []byte) []byte { return rw.RewriteAnswer(connectors.APIChat, d, h) }
	var out []byte
	benchEvents(b, func(ev []byte) { out = sse.Rewrite(out[:0], ev, fn) })
}

// BenchmarkHeaderParsing is the per-request header work: the prefiller
// pick (first and sampled) and the request id check.
func BenchmarkHeaderParsing(b *testing.B) {
	cases := []struct {
		name     string
		v        []byte
		sampling bool
	}{
		{"prefiller-single", []byte("10.0.0.12:8000"), false},
		{"prefiller-list-sampled", []byte("10.0.0.12:8000, 10.0.0.13:8000, 10.0.0.14:8000"), true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := pickPrefiller(c.v, c.sampling); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("request-id-kept", func(b *testing.B) {
		id := []byte("4f0c2a9e-5d1b-4b6a-9a3f-0e1d2c3b4a59")
		b.ReportAllocs()
		for b.Loop() {
			_ = RequestID(id)
		}
	})
}

// BenchmarkLoopStreamRelay is an event loop's work on a 16-token stream as
// it comes off the engine connection: chunked framing decoded, events cut
// and appended to the client's chunk, one read of 4 KiB at a time (an event split across two reads costs a copy).
func BenchmarkLoopStreamRelay(b *testing.B) {
	stream := sseStream(16)
	var framed []byte
	for rest := stream; len(rest) > 0; {
		i := bytes.Index(rest, []byte("\n\n")) + 2
		framed = httpbody.AppendChunk(framed, rest[:i])
		rest = rest[i:]
	}
	framed = append(framed, httpbody.LastChunk...)
	out := make([]byte, 0, 64<<10)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		ls := sserelay.Stream{Body: httpbody.New(httpbody.Chunked, 0)} // the loop stream's relay
		for rest := framed; len(rest) > 0; {
			n := min(len(rest), 4<<10)
			var err error
			if out, err = ls.FeedRaw(out[:0], rest[:n]); err != nil {
				b.Fatal(err)
			}
			rest = rest[n:]
		}
		if !ls.Body.Done() {
			b.Fatal("body not done")
		}
	}
}
