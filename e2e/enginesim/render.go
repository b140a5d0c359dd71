package enginesim

import (
	"encoding/json"
	"strconv"
	"strings"
)

// output is everything a finished (or finishing) request reports.
type output struct {
	api          api
	id           string
	requestID    string
	model        string
	created      int64
	promptTokens int
	cachedTokens int
	tokens       []int
	finish       string
	// kv is the kv_transfer_params of the answer (nil renders null).
	kv map[string]any
	// kvInStream makes a streamed completions or chat answer carry kv,
	// when set by then, as a top-level member of the chunk with the
	// finish_reason (set with bidirectional KV transfer, whose decode legs
	// hand their pinned sequence to the client that way).
	kvInStream bool
	// reasoning is the number of leading output tokens a chat answer
	// renders as reasoning_content (Config.ReasoningTokens).
	reasoning int
	// localHost is the address the client reached this engine at, advertised
	// as remote_host when the KV side channel listens on a wildcard address.
	localHost string
	// chunkPrefix caches the constant head of a streamed chunk.
	chunkPrefix []byte
	// ended is set once the engine finished the request's answer (or cut
	// it by a fault): a client that leaves after that did not cancel it.
	ended bool
}

func (o *output) text() string { return wordsOf(o.tokens) }

// wordsOf renders tokens as text.
func wordsOf(tokens []int) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString(Word(t))
	}
	return b.String()
}

// chatMessage is a chat answer's message. With reasoning tokens, the first
// of them are reasoning_content and content the rest: null when nothing
// followed the reasoning, as vLLM's reasoning parsers leave it.
func (o *output) chatMessage() map[string]any {
	msg := map[string]any{"role": "assistant", "content": o.text(), "tool_calls": []any{}}
	if o.reasoning > 0 {
		r := min(o.reasoning, len(o.tokens))
		msg["reasoning_content"] = wordsOf(o.tokens[:r])
		if r < len(o.tokens) {
			msg["content"] = wordsOf(o.tokens[r:])
		} else {
			msg["content"] = nil
		}
	}
	return msg
}

func (o *output) completionTokens() int { return len(o.tokens) }

func (o *output) usage() map[string]any {
	return map[string]any{
		"prompt_tokens":         o.promptTokens,
		"completion_tokens":     o.completionTokens(),
		"total_tokens":          o.promptTokens + o.completionTokens(),
		"prompt_tokens_details": map[string]any{"cached_tokens": o.cachedTokens},
	}
}

func (o *output) kvValue() any {
	if o.kv == nil {
		return nil
	}
	return o.kv
}

// stopReason maps a vLLM finish_reason to Anthropic's stop_reason.
func stopReason(finish string) string {
	if finish == "length" {
		return "max_tokens"
	}
	return "end_turn"
}

// responseJSON is the non-streaming answer body.
func responseJSON(o *output) []byte {
	var v map[string]any
	switch o.api {
	case apiCompletions:
		v = map[string]any{
			"id": o.id, "object": "text_completion", "created": o.created, "model": o.model,
			"choices": []any{map[string]any{
				"index": 0, "text": o.text(), "logprobs": nil, "finish_reason": o.finish,
				"stop_reason": nil, "prompt_logprobs": nil,
			}},
			"usage": o.usage(), "kv_transfer_params": o.kvValue(),
		}
	case apiChat:
		v = map[string]any{
			"id": o.id, "object": "chat.completion", "created": o.created, "model": o.model,
			"choices": []any{map[string]any{
				"index":    0,
				"message":  o.chatMessage(),
				"logprobs": nil, "finish_reason": o.finish, "stop_reason": nil,
			}},
			"usage": o.usage(), "prompt_logprobs": nil, "kv_transfer_params": o.kvValue(),
		}
	case apiResponses:
		v = responsesObject(o, "completed")
	case apiMessages:
		v = map[string]any{
			"id": o.id, "type": "message", "role": "assistant", "model": o.model,
			"content":     []any{map[string]any{"type": "text", "text": o.text()}},
			"stop_reason": stopReason(o.finish), "stop_sequence": nil,
			"usage": map[string]any{
				"input_tokens": o.promptTokens, "output_tokens": o.completionTokens(),
				"cache_read_input_tokens": o.cachedTokens,
			},
			"kv_transfer_params": o.kvValue(),
		}
	case apiGenerate:
		v = map[string]any{
			"request_id": o.requestID,
			"choices": []any{map[string]any{
				"index": 0, "token_ids": nonNil(o.tokens), "logprobs": nil, "finish_reason": o.finish,
			}},
			"usage": o.usage(), "prompt_logprobs": nil, "kv_transfer_params": o.kvValue(),
		}
	}
	b, _ := json.Marshal(v)
	return b
}

func nonNil(t []int) []int {
	if t == nil {
		return []int{}
	}
	return t
}

func responsesObject(o *output, status string) map[string]any {
	var incomplete any
	if status == "completed" && o.finish == "length" {
		status = "incomplete"
		incomplete = map[string]any{"reason": "max_output_tokens"}
	}
	return map[string]any{
		"id": o.id, "object": "response", "created_at": o.created, "model": o.model,
		"status": status, "incomplete_details": incomplete,
		"output": []any{map[string]any{
			"type": "message", "id": "msg_" + o.requestID, "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": o.text(), "annotations": []any{}}},
		}},
		"usage": map[string]any{
			"input_tokens": o.promptTokens, "output_tokens": o.completionTokens(),
			"total_tokens":          o.promptTokens + o.completionTokens(),
			"input_tokens_details":  map[string]any{"cached_tokens": o.cachedTokens},
			"output_tokens_details": map[string]any{"reasoning_tokens": 0},
		},
		"kv_transfer_params": o.kvValue(),
	}
}

// sseEvent is one server-sent event: an optional event name and its data.
type sseEvent struct {
	name string
	data []byte
}

func dataEvent(v any) sseEvent {
	b, _ := json.Marshal(v)
	return sseEvent{data: b}
}

func namedEvent(name string, v any) sseEvent {
	b, _ := json.Marshal(v)
	return sseEvent{name: name, data: b}
}

var doneEvent = sseEvent{data: []byte("[DONE]")}

// streamOpen returns the events sent when the first result is ready: the
// role chunk for chat, the created/start events for responses and messages.
func streamOpen(o *output) []sseEvent {
	switch o.api {
	case apiChat:
		return []sseEvent{dataEvent(chatChunk(o, map[string]any{"role": "assistant", "content": ""}, nil))}
	case apiResponses:
		return []sseEvent{namedEvent("response.created", map[string]any{
			"type": "response.created", "response": responsesObject(o, "in_progress"),
		})}
	case apiMessages:
		return []sseEvent{
			namedEvent("message_start", map[string]any{"type": "message_start", "message": map[string]any{
				"id": o.id, "type": "message", "role": "assistant", "model": o.model, "content": []any{},
				"stop_reason": nil, "stop_sequence": nil,
				"usage": map[string]any{"input_tokens": o.promptTokens, "output_tokens": 0, "cache_read_input_tokens": o.cachedTokens},
			}}),
			namedEvent("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
				"content_block": map[string]any{"type": "text", "text": ""}}),
		}
	}
	return nil
}

func chatChunk(o *output, delta map[string]any, finish any) map[string]any {
	return map[string]any{
		"id": o.id, "object": "chat.completion.chunk", "created": o.created, "model": o.model,
		"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}},
	}
}

// streamToken returns the event for output token i (finish set on the last).
// Completions and chat, the hot path of every benchmark, are rendered from a
// per-request prefix instead of a map.
func streamToken(o *output, i int, finish string) sseEvent {
	tok := o.tokens[i]
	switch o.api {
	case apiCompletions, apiChat:
		return sseEvent{data: tokenChunk(o, i, Word(tok), finish)}
	case apiResponses:
		return namedEvent("response.output_text.delta", map[string]any{
			"type": "response.output_text.delta", "item_id": "msg_" + o.requestID,
			"output_index": 0, "content_index": 0, "delta": Word(tok), "sequence_number": i + 1,
		})
	case apiMessages:
		return namedEvent("content_block_delta", map[string]any{
			"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": Word(tok)},
		})
	default:
		var fin any
		if finish != "" {
			fin = finish
		}
		return dataEvent(map[string]any{
			"request_id": o.requestID,
			"choices":    []any{map[string]any{"index": 0, "token_ids": []int{tok}, "logprobs": nil, "finish_reason": fin}},
		})
	}
}

// tokenChunk renders the completions or chat chunk of output token i,
// which reads as word (plain ASCII, needing no escaping): a chat answer's
// reasoning tokens go out as delta.reasoning_content, the others as
// delta.content. The chunk with the finish_reason carries the answer's
// kv_transfer_params when o.kvInStream is set and there are any.
func tokenChunk(o *output, i int, word, finish string) []byte {
	if o.chunkPrefix == nil {
		id, _ := json.Marshal(o.id)
		model, _ := json.Marshal(o.model)
		object := `"text_completion"`
		if o.api == apiChat {
			object = `"chat.completion.chunk"`
		}
		p := append([]byte(`{"id":`), id...)
		p = append(p, `,"object":`...)
		p = append(p, object...)
		p = append(p, `,"created":`...)
		p = strconv.AppendInt(p, o.created, 10)
		p = append(p, `,"model":`...)
		p = append(p, model...)
		p = append(p, `,"choices":[{"index":0,`...)
		o.chunkPrefix = p
	}
	b := make([]byte, 0, len(o.chunkPrefix)+len(word)+96)
	b = append(b, o.chunkPrefix...)
	switch {
	case o.api != apiChat:
		b = append(b, `"text":"`...)
	case i < o.reasoning:
		b = append(b, `"delta":{"reasoning_content":"`...)
	default:
		b = append(b, `"delta":{"content":"`...)
	}
	b = append(b, word...)
	if o.api == apiChat {
		b = append(b, `"},"logprobs":null,"finish_reason":`...)
	} else {
		b = append(b, `","logprobs":null,"finish_reason":`...)
	}
	if finish == "" {
		b = append(b, "null"...)
	} else {
		b = append(b, '"')
		b = append(b, finish...)
		b = append(b, '"')
	}
	if o.api == apiChat {
		b = append(b, "}]"...)
	} else {
		b = append(b, `,"stop_reason":null}]`...)
	}
	if finish != "" && o.kvInStream && o.kv != nil {
		kv, _ := json.Marshal(o.kv)
		b = append(b, `,"kv_transfer_params":`...)
		b = append(b, kv...)
	}
	return append(b, '}')
}

// streamClose returns the events after the last token: usage (when asked
// for) and the terminator of each API.
func streamClose(o *output, includeUsage bool) []sseEvent {
	switch o.api {
	case apiResponses:
		return []sseEvent{namedEvent("response.completed", map[string]any{
			"type": "response.completed", "response": responsesObject(o, "completed"),
		})}
	case apiMessages:
		return []sseEvent{
			namedEvent("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}),
			namedEvent("message_delta", map[string]any{"type": "message_delta",
				"delta": map[string]any{"stop_reason": stopReason(o.finish), "stop_sequence": nil},
				"usage": map[string]any{"output_tokens": o.completionTokens()}}),
			namedEvent("message_stop", map[string]any{"type": "message_stop"}),
		}
	}
	var evs []sseEvent
	if includeUsage {
		object := "text_completion"
		if o.api == apiChat {
			object = "chat.completion.chunk"
		}
		evs = append(evs, dataEvent(map[string]any{
			"id": o.id, "object": object, "created": o.created, "model": o.model,
			"choices": []any{}, "usage": o.usage(),
		}))
	}
	return append(evs, doneEvent)
}

// errorBody is vLLM's OpenAI-style error.
func errorBody(status int, typ, param, msg string) []byte {
	var p any
	if param != "" {
		p = param
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": p, "code": status,
	}})
	return b
}

// internalErrorBody is what vLLM answers on a KV load failure under the
// "fail" policy.
func internalErrorBody() []byte {
	return errorBody(500, "InternalServerError", "", "Internal server error")
}

// streamError returns the events vLLM sends when a streaming request fails
// after the stream began.
func streamError() []sseEvent {
	return []sseEvent{{data: internalErrorBody()}, doneEvent}
}
