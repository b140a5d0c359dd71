package multiturn

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"slices"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// The sequence a decode engine saw and produced, as the sidecar can tell
// it without a tokenizer: the request's text (a chat's messages, a
// completion's prompt) followed by the answer it generated, reasoning
// included, under the request members that change how the engine renders
// that text into tokens. A turn may use a history only when its own text
// extends that sequence exactly; the engine that pulls the history checks
// nothing (it takes block i to hold tokens [i·bs, (i+1)·bs) of its prompt),
// so this check is all that stands between a changed history — reasoning
// stripped, a message edited, another conversation's session key — and KV
// of the wrong tokens.

// renderKeys are the request members besides the text that change the
// tokens a chat template or a tokenizer makes of it, or the KV computed
// for them: a turn must carry each exactly as the turn that left the
// history did (absent included).
//
// Read from vLLM's ChatCompletionRequest and CompletionRequest
// (vllm-project/vllm, vllm/entrypoints/openai/chat_completion/protocol.py
// and vllm/entrypoints/openai/completion/protocol.py at commit
// d5dba2d7b0ab9b98096560c69db7126b54b14d79): the members build_chat_params
// hands the chat template (chat_template, chat_template_kwargs and, merged
// into them, add_generation_prompt, continue_final_message, documents,
// reasoning_effort; tools and tool_choice go to the renderer beside them),
// the members build_tok_params hands the tokenizer (add_special_tokens,
// truncate_prompt_tokens, which keeps only the prompt's last tokens, so a
// history's block i no longer holds what the prompt's block i does), the
// multi-modal processor's (mm_processor_kwargs, media_io_kwargs: how an
// image or a video becomes placeholder tokens), a completion's
// prompt_embeds (the prompt given as embeddings) and suffix, echo, the
// model, and cache_salt: vLLM salts the prefix cache's block hashes with
// it so that one tenant's KV never serves another's, and a history pulled
// across salts would do exactly that. chat_template_content_format is
// the server's --chat-template-content-format at that commit, not a
// request member, but earlier servers and proxies pass it per request and
// it decides how a message's content parts are rendered. Members that act
// only on sampling or on the answer's text (temperature, stop,
// skip_special_tokens, structured_outputs, response_format, priority,
// return_tokens_as_token_ids, parallel_tool_calls) leave the prompt's
// tokens as they are and are not hashed: the answer's text, which the
// sequence holds, is what skip_special_tokens changes.
var renderKeys = [...]string{
	"model", "tools", "tool_choice", "chat_template", "chat_template_kwargs",
	"documents", "add_generation_prompt", "continue_final_message",
	"add_special_tokens", "reasoning_effort", "suffix", "echo",
	"truncate_prompt_tokens", "chat_template_content_format",
	"mm_processor_kwargs", "media_io_kwargs", "prompt_embeds", "cache_salt",
}

// Prompt is what a request tells of its sequence.
type Prompt struct {
	api connectors.API
	// narrow is the digest of what a history must share with the turn
	// besides its text: the render members and the session key.
	narrow   [sha256.Size]byte
	messages []gjson.Result // a chat's
	text     string         // a completion's prompt
	model    string
}

// ReadPrompt reads body's sequence, narrowed to session (the session key,
// "" for none): a history is found by its content, and a session key only
// narrows where it is looked for (one kept under another key, or under
// none, is not this turn's). ok is false for what multi-turn reuse does not
// cover: an API other than chat and completions, a prompt that is not one
// string, a chat without messages, or more than one choice asked.
func ReadPrompt(api connectors.API, body []byte, session string) (Prompt, bool) {
	p := Prompt{api: api}
	// One pass over the top level: one parse has refused a repeated
	// name, so each member read here is the one the engine reads.
	var render [len(renderKeys)]gjson.Result
	var messages, prompt, echo gjson.Result
	many := false
	gjson.Parse(connectors.Bytes(body)).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "messages":
			messages = v
		case "prompt":
			prompt = v
		case "echo":
			echo = v
		case "n":
			many = many || v.Type != gjson.Null && v.Int() != 1
		case "best_of":
			many = many || v.Type != gjson.Null && v.Int() > 1
		}
		if i := slices.Index(renderKeys[:], k.Str); i >= 0 {
			render[i] = v
		}
		return true
	})
	if many {
		return p, false
	}
	p.model = render[0].String() // renderKeys[0]: the model
	switch api {
	case connectors.APIChat:
		if !messages.IsArray() {
			return p, false
		}
		p.messages = messages.Array()
		if len(p.messages) == 0 {
			return p, false
		}
	case connectors.APICompletions:
		if prompt.Type != gjson.String {
			return p, false
		}
		if echo.Type == gjson.True {
			return p, false // the answer's text repeats the prompt
		}
		p.text = prompt.String()
	default:
		return p, false
	}
	w := &writer{h: sha256.New()}
	for i, k := range renderKeys {
		w.field(k)
		if v := render[i]; v.Exists() {
			w.field(v.Raw)
		} else {
			w.field("\x00absent")
		}
	}
	w.field("\x00session")
	w.field(session)
	w.h.Sum(p.narrow[:0])
	return p, true
}

// Narrow is the digest of what narrows the search for a history: the
// render members (the model, cache_salt, the template settings...) and
// the session key. Two requests that differ in it never share a history.
func (p *Prompt) Narrow() [sha256.Size]byte { return p.narrow }

// Continues reports whether the turn may continue an earlier one: a
// chat that carries an answer (an assistant message; a first turn
// carries none), any completion (a prompt does not say). A chat's
// messages are looked at from the last, where a next turn's answer is.
func (p *Prompt) Continues() bool {
	if p.api != connectors.APIChat {
		return true
	}
	for i := len(p.messages) - 1; i >= 0; i-- {
		if p.messages[i].Get("role").Str == "assistant" {
			return true
		}
	}
	return false
}

// Model is the request's model.
func (p *Prompt) Model() string { return p.model }

// Len is the sequence's length in its units: messages for a chat, bytes
// of prompt for a completion.
func (p *Prompt) Len() int {
	if p.api == connectors.APIChat {
		return len(p.messages)
	}
	return len(p.text)
}

// PrefixSum is the digest of the first n units of the request's sequence
// (n ≤ Len): what the turn that left a history of length n must have
// summed to for this turn to extend it.
func (p *Prompt) PrefixSum(n int) [sha256.Size]byte {
	sums, _ := p.Prefixes([]int{n})
	return sums[0]
}

// Prefixes returns the digests of the sequence's first n units for each n
// of lens (ascending, each at most Len), in one pass over the sequence, and
// the hash of the whole sequence, for the answer's text to follow.
func (p *Prompt) Prefixes(lens []int) ([][sha256.Size]byte, hash.Hash) {
	sums := make([][sha256.Size]byte, len(lens))
	h := sha256.New()
	h.Write(p.narrow[:])
	j := 0
	sum := func(at int) {
		for ; j < len(lens) && lens[j] == at; j++ {
			h.Sum(sums[j][:0]) // Sum leaves the hash's state as it is
		}
	}
	sum(0)
	if p.api == connectors.APIChat {
		mh := messageHasher{msg: &writer{h: sha256.New()}, text: sha256.New()}
		var ms [sha256.Size]byte
		for i, m := range p.messages {
			mh.sum(m, &ms)
			h.Write(ms[:])
			sum(i + 1)
		}
		return sums, h
	}
	at := 0
	for j < len(lens) {
		if lens[j] < at {
			j++ // not ascending: no digest
			continue
		}
		n := min(lens[j], len(p.text))
		h.Write(view(p.text[at:n]))
		at = n
		sum(n)
		if n == len(p.text) {
			break
		}
	}
	h.Write(view(p.text[at:]))
	return sums, h
}

// messageHasher sums chat messages one after another with the same two
// hash states.
type messageHasher struct {
	msg  *writer
	text hash.Hash
}

// sum writes to out the digest of one chat message: the members a chat
// template renders (role, name, content, reasoning, tool calls and the
// tool call answered), each tagged with its JSON type.
func (mh *messageHasher) sum(m gjson.Result, out *[sha256.Size]byte) {
	var role, name, content, reasoningContent, reasoning, toolCalls, toolCallID gjson.Result
	m.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "role":
			role = v
		case "name":
			name = v
		case "content":
			content = v
		case "reasoning_content":
			reasoningContent = v
		case "reasoning":
			reasoning = v
		case "tool_calls":
			toolCalls = v
		case "tool_call_id":
			toolCallID = v
		}
		return true
	})
	w := mh.msg
	w.h.Reset()
	w.field(role.String())
	w.field(name.String())
	w.text(mh.text, content)
	if reasoningContent.Exists() && reasoningContent.Type != gjson.Null {
		reasoning = reasoningContent
	}
	w.text(mh.text, reasoning)
	if toolCalls.IsArray() && nonEmpty(toolCalls) {
		w.field(toolCalls.Raw)
	} else {
		w.field("\x00none")
	}
	w.field(toolCallID.String())
	w.h.Sum(out[:0])
}

// nonEmpty reports whether the array a has an element.
func nonEmpty(a gjson.Result) bool {
	found := false
	a.ForEach(func(_, _ gjson.Result) bool {
		found = true
		return false
	})
	return found
}

// answerSum is messageHasher.sum of the assistant message a decode answer makes:
// its content and reasoning as their hashes summed them.
func answerSum(content, reasoning hash.Hash) []byte {
	w := &writer{h: sha256.New()}
	w.field("assistant")
	w.field("")
	w.sum('s', content)
	w.sum('s', reasoning)
	w.field("\x00none")
	w.field("")
	return w.h.Sum(nil)
}

// writer writes fields to a hash through a buffer of its own, so that no
// write allocates.
type writer struct {
	h hash.Hash
	b [1 + sha256.Size]byte
}

// text writes a content-like member: a string as the digest of its text
// (so the answer's streamed text, hashed as it comes, compares equal),
// absent and null as the empty string, anything else (content parts) as
// its raw JSON under another tag. t is the text's hash, reset here.
func (w *writer) text(t hash.Hash, v gjson.Result) {
	t.Reset()
	switch {
	case !v.Exists() || v.Type == gjson.Null || v.Type == gjson.String:
		t.Write(view(v.String()))
		w.sum('s', t)
	default:
		t.Write(view(v.Raw))
		w.sum('j', t)
	}
}

// sum writes t's digest under tag.
func (w *writer) sum(tag byte, t hash.Hash) {
	w.b[0] = tag
	t.Sum(w.b[1:1])
	w.h.Write(w.b[:])
}

// field writes s length-prefixed, so that no two field lists hash alike.
func (w *writer) field(s string) {
	binary.LittleEndian.PutUint64(w.b[:8], uint64(len(s)))
	w.h.Write(w.b[:8])
	w.h.Write(view(s))
}

// view is s as bytes without a copy, for a hash's Write, which neither
// keeps nor changes them.
func view(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
