package connectors

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// EventKind classifies one SSE data payload of a decode answer, for the
// proxy's decision whether anything has reached the client yet.
type EventKind uint8

// The kinds of SSE data payload.
const (
	// EventContent carries generated output (or anything not known to be
	// preamble); once sent, a failed decode can no longer be re-run.
	EventContent EventKind = iota
	// EventPreamble carries no generated token (the chat role chunk, the
	// responses and messages start events) and may be held back.
	EventPreamble
	// EventError is an error object in the stream.
	EventError
	// EventDone is the [DONE] terminator.
	EventDone
)

var doneData = []byte("[DONE]")

// IsDone reports whether an SSE data payload is the [DONE] terminator. It
// is the cheap test for the relay's per-event hot path; ClassifyEvent
// parses the payload.
func IsDone(data []byte) bool { return bytes.Equal(bytes.TrimSpace(data), doneData) }

// ClassifyEvent tells what one SSE data payload of api carries.
func ClassifyEvent(api API, data []byte) EventKind {
	data = bytes.TrimSpace(data)
	if bytes.Equal(data, doneData) {
		return EventDone
	}
	if !IsObject(data) {
		return EventContent
	}
	js := Bytes(data)
	typ := gjson.Get(js, "type").Str
	if gjson.Get(js, "error").Exists() || typ == "error" {
		return EventError
	}
	switch api {
	case APIChat:
		d := gjson.Get(js, "choices.0.delta")
		if d.Get("role").Exists() && d.Get("content").String() == "" &&
			!d.Get("tool_calls").Exists() && !d.Get("reasoning_content").Exists() &&
			gjson.Get(js, "choices.0.finish_reason").String() == "" {
			return EventPreamble
		}
	case APIResponses:
		switch typ {
		case "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added":
			return EventPreamble
		}
	case APIMessages:
		switch typ {
		case "message_start", "content_block_start", "ping":
			return EventPreamble
		}
	}
	return EventContent
}

// Finished tells how a non-streamed answer of api ended: stop is true when
// generation ended by itself (EOS or a stop sequence), length when it hit
// its token cap.
func Finished(api API, answer []byte) (stop, length bool) {
	js := Bytes(answer)
	var r string
	switch api {
	case APIMessages:
		r = gjson.Get(js, "stop_reason").Str
		return r == "end_turn" || r == "stop_sequence", r == "max_tokens"
	case APIResponses:
		if gjson.Get(js, "status").Str == "completed" {
			return true, false
		}
		return false, gjson.Get(js, "incomplete_details.reason").Str == "max_output_tokens"
	}
	r = gjson.Get(js, "choices.0.finish_reason").Str
	return r == "stop", r == "length"
}
