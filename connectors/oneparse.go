package connectors

import (
	"bytes"
	"errors"
	"fmt"
	"math"
)

// One parse: what the sidecar reads, checks, hashes or edits in a request
// body must be exactly what the engine behind it will read. JSON leaves
// three things to the decoder, and the decoders in play disagree on each:
//
//   - A name given twice in one object: gjson (which the sidecar reads
//     with) takes the first member, Python's json (vLLM, SGLang) and Go's
//     encoding/json (engine-sim, llm-d-inference-sim) the last.
//   - A name that differs from another only in case: Go's encoding/json
//     matches a struct field case-insensitively (with Unicode simple
//     folding, so "ſtream" is "stream"); Python does not.
//   - A lone UTF-16 surrogate escape ("\ud800"): Python keeps it as is,
//     Go and gjson read U+FFFD.
//   - A stream flag that is not a JSON boolean: vLLM's pydantic takes
//     "yes", "on" and 1 for true, gjson reads "yes" as false, Go engines
//     refuse it (BodyTop).
//
// Escaped names ("\u0063ontent") are no disagreement: every decoder
// unescapes names, and so does the sidecar. A request body the decoders
// could read differently is refused (ErrAmbiguousJSON) before anything
// reads it, so the first-member reading the sidecar does everywhere is the
// one reading there is.

// ErrAmbiguousJSON: the body is well-formed JSON that decoders read
// differently (a member name given twice in one object, a name that
// differs only in case from one the sidecar reads, a lone surrogate
// escape, a stream flag that is not a boolean); the caller refuses it rather than act on one reading of it
// while the engine takes another.
var ErrAmbiguousJSON = errors.New("connectors: request body is JSON that engines read differently")

// readNames are the member names the sidecar or an engine's typed request
// reads in a request body's read objects (readContainers): a name that
// differs from one of these only in case is refused there, since a
// case-insensitive decoder takes it for the member the sidecar read.
var readNames = map[string]struct{}{
	// Top level: what the sidecar reads, edits or hashes.
	"model": {}, "messages": {}, "prompt": {}, "input": {}, "instructions": {}, "store": {}, "stream": {}, "stream_options": {},
	"max_tokens": {}, "max_completion_tokens": {}, "max_output_tokens": {}, "min_tokens": {},
	"min_completion_tokens": {}, "n": {}, "best_of": {}, "echo": {}, "suffix": {},
	"kv_transfer_params": {}, "ec_transfer_params": {}, "bootstrap_host": {}, "bootstrap_port": {},
	"bootstrap_room": {}, "bootstrap_pair_key": {}, "conversation_id": {}, "cache_hit_threshold": {},
	"sampling_params": {}, "extra_args": {}, "previous_response_id": {}, "cache_salt": {},
	"tools": {}, "tool_choice": {}, "chat_template": {}, "chat_template_kwargs": {}, "documents": {},
	"add_generation_prompt": {}, "continue_final_message": {}, "add_special_tokens": {},
	"reasoning_effort": {}, "truncate_prompt_tokens": {}, "chat_template_content_format": {},
	"mm_processor_kwargs": {}, "media_io_kwargs": {}, "prompt_embeds": {}, "include_usage": {}, "input_ids": {}, "text": {},
	// Inside a chat message and its content parts.
	"role": {}, "content": {}, "name": {}, "reasoning_content": {}, "reasoning": {},
	"tool_calls": {}, "tool_call_id": {}, "type": {}, "image_url": {}, "url": {},
	// Inside connector fields.
	"remote_host": {}, "remote_port": {}, "remote_engine_id": {}, "remote_request_id": {},
	"remote_block_ids": {}, "remote_bootstrap_addr": {}, "transfer_id": {}, "kv_source": {},
	"kv_preloaded": {}, "do_remote_decode": {}, "do_remote_prefill": {},
}

// readContainer reports whether the member name of a read object holds a
// value read by name too: an object value is a read object, and so is each
// object in an array value (a chat's messages, a message's content parts).
func readContainer(name []byte) bool {
	switch string(name) {
	case "messages", "input", "content", "stream_options", "sampling_params",
		"extra_args", "kv_transfer_params", "ec_transfer_params", "image_url":
		return true
	}
	return false
}

// objectKind is what the validator checks of an object's member names.
type objectKind uint8

const (
	// anyObject: no two members of one name (escapes decoded).
	anyObject objectKind = iota
	// readObject: that, and no name that differs only in case from a
	// name of readNames.
	readObject
)

// memberNames are the decoded member names of the objects a validator is
// in, innermost last, as spans of the body or of buf: the first 32 in the
// struct itself (on the validator's stack), the rest in more. Small
// objects are checked by a scan, an object past namesScanMax members by a
// set of its own.
type memberNames struct {
	body []byte
	arr  [32]nameSpan
	n    int
	more []nameSpan
	buf  []byte // decoded escaped names
}

func (m *memberNames) at(i int) nameSpan {
	if i < len(m.arr) {
		return m.arr[i]
	}
	return m.more[i-len(m.arr)]
}

func (m *memberNames) push(n nameSpan) {
	if m.n < len(m.arr) {
		m.arr[m.n] = n
	} else {
		m.more = append(m.more, n)
	}
	m.n++
}

// nameSpan is a name: body[s:e], or buf[s:e] when decoded.
type nameSpan struct {
	s, e    int
	decoded bool
}

func (m *memberNames) bytes(n nameSpan) []byte {
	if n.decoded {
		return m.buf[n.s:n.e]
	}
	return m.body[n.s:n.e]
}

// namesScanMax is the member count past which an object's names are kept
// in a set instead of compared one by one.
const namesScanMax = 16

// objectNames is one object's part of memberNames.
type objectNames struct {
	base, bufBase int
	set           map[string]struct{}
}

// begin starts an object's names.
func (m *memberNames) begin() objectNames {
	return objectNames{base: m.n, bufBase: len(m.buf)}
}

// add records the member name body[s:e] (still escaped: escaped tells
// whether it has an escape) for the object o and returns it decoded; ok is
// false when o already has a member of that name.
func (m *memberNames) add(o *objectNames, s, e int, escaped bool) (name []byte, ok bool) {
	span := nameSpan{s: s, e: e}
	if escaped {
		span.s = len(m.buf)
		m.buf, _ = unescape(m.buf, m.body[s:e], math.MaxInt) // validated: no bad escape
		span.e, span.decoded = len(m.buf), true
	}
	name = m.bytes(span)
	if o.set != nil {
		if _, dup := o.set[string(name)]; dup {
			return name, false
		}
		o.set[string(name)] = struct{}{}
		return name, true
	}
	for i := o.base; i < m.n; i++ {
		if bytes.Equal(m.bytes(m.at(i)), name) {
			return name, false
		}
	}
	if m.n-o.base == namesScanMax {
		o.set = make(map[string]struct{}, 2*namesScanMax)
		for i := o.base; i < m.n; i++ {
			o.set[string(m.bytes(m.at(i)))] = struct{}{}
		}
		o.set[string(name)] = struct{}{}
		return name, true
	}
	m.push(span)
	return name, true
}

// end drops o's names.
func (m *memberNames) end(o *objectNames) {
	m.n = o.base
	if m.n > len(m.arr) {
		m.more = m.more[:m.n-len(m.arr)]
	} else {
		m.more = m.more[:0]
	}
	m.buf = m.buf[:o.bufBase]
}

// caseVariant reports whether name differs from a name of readNames only
// in case (as bytes.EqualFold and Go's encoding/json fold it). A name of
// lower-case ASCII, as nearly all are, costs one pass over its bytes.
func caseVariant(name []byte) bool {
	plain := true
	for _, c := range name {
		if c-'A' < 26 || c >= 0x80 {
			plain = false
			break
		}
	}
	if plain {
		return false
	}
	var low [32]byte
	if len(name) > len(low) { // longer than any read name, unless it folds to fewer bytes
		for _, c := range name {
			if c >= 0x80 {
				return foldsToReadName(name)
			}
		}
		return false
	}
	for i, c := range name {
		switch {
		case c >= 0x80:
			return foldsToReadName(name)
		case c-'A' < 26:
			c += 'a' - 'A'
		}
		low[i] = c
	}
	_, ok := readNames[string(low[:len(name)])]
	return ok
}

// foldsToReadName is caseVariant for a name with non-ASCII bytes, which
// may fold to ASCII ones (U+017F to s, U+212A to k).
func foldsToReadName(name []byte) bool {
	for n := range readNames {
		if bytes.EqualFold(name, []byte(n)) {
			return true
		}
	}
	return false
}

// ambiguous is the validator's ErrAmbiguousJSON at its offset. A name is
// quoted only when it is one of readNames (the client's bytes are never
// echoed otherwise).
func (v *validator) ambiguous(what string, name []byte) error {
	if _, known := readNames[string(name)]; known {
		return fmt.Errorf("%w: %s %q at byte %d", ErrAmbiguousJSON, what, string(name), v.i)
	}
	return fmt.Errorf("%w: %s at byte %d", ErrAmbiguousJSON, what, v.i)
}
