package connectors

import "github.com/tidwall/gjson"

// BytesPerToken is the divisor of EstimatePromptTokens' text estimate.
// Tokenizers of the common models average about 4 bytes of English text a
// token, and no fewer than about 3 for code or most other scripts; 3 makes
// the estimate of most text at or above its real count, so that a prompt
// near a threshold is taken as the longer (see EstimatePromptTokens).
const BytesPerToken = 3

// EstimatePromptTokens estimates how many tokens the prompt of an inference
// request body of api takes, for the short-prompt guard
// (--min-remote-prefill-tokens), which serves a prompt shorter than its
// threshold locally instead of splitting it. ok is false when the body
// gives no prompt it can read, or one whose length the bytes cannot tell
// (then the guard lets the request go on as it would without it).
//
// The rule, in one pass over the body's top level (gjson):
//   - Token ids are counted exactly: the completions (and generate)
//     "prompt" as a list of ids, or a batch of such lists (summed);
//     "prompt_token_ids"; generate's "token_ids".
//   - Text is estimated as ceil(bytes / BytesPerToken) over the prompt's
//     text as the JSON writes it (an escape counts its bytes): a
//     completions "prompt" string or batch of strings (summed) and its
//     "suffix"; the text of chat "messages", Responses "input" and
//     "instructions", Anthropic "messages" and "system"; and "tools"
//     (the tool definitions the chat template renders) as raw JSON.
//   - A message's "content" is a string, or a list of text parts ("type"
//     text, input_text or output_text, with a string "text"); its other
//     members (role, name, tool calls, a Responses item's type and
//     arguments) count as their raw JSON, which stands in for the chat
//     template's own tokens around each message.
//   - A content part of any other type (an image, audio, a file, a tool
//     result) makes the estimate unknown: such items take many tokens
//     that their bytes do not show. So does a prompt field of a type the
//     API does not take, and a prompt of no tokens at all.
//
// Every prompt field present counts, so a body that carries its prompt
// twice (a repeated member, or both text and ids) is estimated as the
// longer still. The estimate is meant to err high: a request the guard
// is unsure of is split, as it would be without the guard.
func EstimatePromptTokens(api API, body []byte) (tokens int, ok bool) {
	var e promptEstimate
	gjson.Parse(Bytes(body)).ForEach(func(k, v gjson.Result) bool {
		e.member(api, k.Str, v)
		return !e.unknown
	})
	if e.unknown {
		return 0, false
	}
	n := e.ids + (e.text+BytesPerToken-1)/BytesPerToken
	return n, n > 0
}

// promptEstimate accumulates EstimatePromptTokens' counts.
type promptEstimate struct {
	ids     int  // token ids, counted exactly
	text    int  // bytes of text
	unknown bool // a prompt whose length cannot be told
}

// member counts one top-level member named name with value v.
func (e *promptEstimate) member(api API, name string, v gjson.Result) {
	switch {
	case name == "prompt_token_ids" && (api == APICompletions || api == APIGenerate),
		name == "token_ids" && api == APIGenerate:
		e.idList(v)
	case name == "prompt" && (api == APICompletions || api == APIGenerate):
		e.prompt(v)
	case name == "suffix" && api == APICompletions:
		e.string(v)
	case name == "tools" && (api == APIChat || api == APIResponses || api == APIMessages):
		e.text += len(v.Raw)
	case name == "messages" && (api == APIChat || api == APIMessages):
		e.messages(v)
	case name == "input" && api == APIResponses:
		if v.Type == gjson.String {
			e.string(v)
			return
		}
		e.messages(v)
	case name == "instructions" && api == APIResponses:
		e.string(v)
	case name == "system" && api == APIMessages:
		if v.Type == gjson.String {
			e.string(v)
			return
		}
		e.parts(v)
	}
}

// string counts a JSON string's bytes (as written, without its quotes);
// null counts nothing; any other type is unknown.
func (e *promptEstimate) string(v gjson.Result) {
	switch v.Type {
	case gjson.String:
		e.text += len(v.Raw) - 2
	case gjson.Null:
	default:
		e.unknown = true
	}
}

// prompt counts a completions prompt: a string, a list of ids, or a batch
// of strings or of id lists (a list whose items are not all of one kind
// is unknown).
func (e *promptEstimate) prompt(v gjson.Result) {
	switch {
	case v.Type == gjson.String:
		e.string(v)
	case !v.IsArray():
		e.unknown = true
	default:
		first := gjson.Type(-1)
		v.ForEach(func(_, x gjson.Result) bool {
			kind := x.Type
			if x.IsArray() {
				kind = gjson.JSON
			}
			if first < 0 {
				first = kind
			}
			switch {
			case kind != first:
				e.unknown = true
			case kind == gjson.Number:
				e.ids++
			case kind == gjson.String:
				e.string(x)
			case x.IsArray():
				e.idList(x)
			default:
				e.unknown = true
			}
			return !e.unknown
		})
	}
}

// idList counts a list of token ids.
func (e *promptEstimate) idList(v gjson.Result) {
	if !v.IsArray() {
		if v.Type != gjson.Null {
			e.unknown = true
		}
		return
	}
	v.ForEach(func(_, x gjson.Result) bool {
		if x.Type != gjson.Number {
			e.unknown = true
			return false
		}
		e.ids++
		return true
	})
}

// messages counts a list of messages (chat, Anthropic) or of Responses
// input items: each one's content, and its other members as raw JSON.
func (e *promptEstimate) messages(v gjson.Result) {
	if !v.IsArray() {
		e.unknown = true
		return
	}
	v.ForEach(func(_, m gjson.Result) bool {
		if !m.IsObject() {
			e.unknown = true
			return false
		}
		m.ForEach(func(k, x gjson.Result) bool {
			switch {
			case k.Str != "content":
				e.text += len(x.Raw)
			case x.Type == gjson.String || x.Type == gjson.Null:
				e.string(x)
			default:
				e.parts(x)
			}
			return !e.unknown
		})
		return !e.unknown
	})
}

// parts counts a list of content parts, text parts only: any other makes
// the estimate unknown.
func (e *promptEstimate) parts(v gjson.Result) {
	if !v.IsArray() {
		e.unknown = true
		return
	}
	v.ForEach(func(_, p gjson.Result) bool {
		switch p.Get("type").Str {
		case "text", "input_text", "output_text":
			if t := p.Get("text"); t.Type == gjson.String {
				e.string(t)
				return true
			}
		}
		e.unknown = true
		return false
	})
}
