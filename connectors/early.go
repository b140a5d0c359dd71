package connectors

import (
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// AnswerAsSSE turns a complete non-streamed answer of api into the SSE
// stream a streaming client expects (chunks, an optional usage chunk, then
// [DONE]), appended to dst. It reports false for APIs whose stream format
// it cannot synthesise (only completions and chat are supported).
func AnswerAsSSE(dst []byte, api API, answer []byte, includeUsage bool) ([]byte, bool) {
	js := Bytes(answer)
	var object string
	switch api {
	case APICompletions:
		object = "text_completion"
	case APIChat:
		object = "chat.completion.chunk"
	default:
		return dst, false
	}
	head := []byte(`{}`)
	head, _ = sjson.SetBytes(head, "id", gjson.Get(js, "id").Value())
	head, _ = sjson.SetBytes(head, "object", object)
	head, _ = sjson.SetBytes(head, "created", gjson.Get(js, "created").Int())
	head, _ = sjson.SetBytes(head, "model", gjson.Get(js, "model").Str)
	choice := gjson.Get(js, "choices.0")
	finish := choice.Get("finish_reason").Value()
	if api == APIChat {
		role, _ := sjson.SetRawBytes(head, "choices", []byte(`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`))
		dst = event(dst, role)
		c, _ := sjson.SetRawBytes(head, "choices", []byte(`[{"index":0,"delta":{},"logprobs":null}]`))
		c, _ = sjson.SetBytes(c, "choices.0.delta.content", choice.Get("message.content").String())
		c, _ = sjson.SetBytes(c, "choices.0.finish_reason", finish)
		dst = event(dst, c)
	} else {
		c, _ := sjson.SetRawBytes(head, "choices", []byte(`[{"index":0,"logprobs":null}]`))
		c, _ = sjson.SetBytes(c, "choices.0.text", choice.Get("text").String())
		c, _ = sjson.SetBytes(c, "choices.0.finish_reason", finish)
		dst = event(dst, c)
	}
	if u := gjson.Get(js, "usage"); includeUsage && u.Exists() {
		c, _ := sjson.SetRawBytes(head, "choices", []byte(`[]`))
		c, _ = sjson.SetRawBytes(c, "usage", []byte(u.Raw))
		dst = event(dst, c)
	}
	return event(dst, doneData), true
}

func event(dst, data []byte) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, data...)
	return append(dst, '\n', '\n')
}
