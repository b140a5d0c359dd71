package chunked

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Decode is the state of one chunked decode, without I/O: Next is the
// body of the next chunk, Add takes in its answer, and once the decode
// Ended, JSON or the events are its stitched answer.
type Decode struct {
	plan Plan
	orig []byte // the decode's body

	chunks int             // chunk requests sent
	tokens int             // completion tokens so far
	text   strings.Builder // the assistant message so far
	last   answer
	first  answer
	ended  bool // the last chunk is in
}

// answer is what the decode keeps of one chunk's answer.
type answer struct {
	json    string // the whole answer
	text    string
	finish  string
	tokens  int
	prompt  int
	usage   string // the usage object (raw; "" when none)
	id      string
	model   string
	created int64
}

// NewDecode returns the decode of body (a chat body PlanFor cut by plan);
// body is only read.
func NewDecode(plan Plan, body []byte) *Decode { return &Decode{plan: plan, orig: body} }

// Chunks is the number of chunk requests sent (Next's bodies).
func (d *Decode) Chunks() int { return d.chunks }

// Tokens is the completion tokens of the answers in so far.
func (d *Decode) Tokens() int { return d.tokens }

// Ended reports whether the last chunk is in.
func (d *Decode) Ended() bool { return d.ended }

// Finish is the finish_reason of the last answer in ("" before any).
func (d *Decode) Finish() string { return d.last.finish }

// Next is the next chunk's request, counted as sent: the decode's body
// asking for at most a chunk of tokens, not streamed; from the second
// chunk on, without kv_transfer_params and continuing the assistant
// message made so far. It fails when the body is no JSON object to edit.
func (d *Decode) Next() ([]byte, error) {
	b, err := d.body()
	if err != nil {
		return nil, err
	}
	d.chunks++
	return b, nil
}

// Add takes in the 200 answer of the chunk Next made last (buf is only
// read) and decides whether the decode ended. An answer that is not a
// chat completion fails with upstream.ErrBadUpstreamAnswer.
func (d *Decode) Add(buf []byte) error {
	a, err := parseChunk(buf)
	if err != nil {
		return err
	}
	d.add(a)
	return nil
}

// parseChunk reads a chunk's 200 answer.
func parseChunk(buf []byte) (answer, error) {
	js := string(buf) // a copy: the response is let go
	if !gjson.Valid(js) {
		return answer{}, fmt.Errorf("%w: a decode chunk's answer is not JSON", upstream.ErrBadUpstreamAnswer)
	}
	v := gjson.GetMany(js, "choices.0", "usage", "id", "model", "created")
	if !v[0].IsObject() {
		return answer{}, fmt.Errorf("%w: a decode chunk's answer has no choices[0]", upstream.ErrBadUpstreamAnswer)
	}
	a := answer{
		json: js, text: v[0].Get("message.content").String(), finish: v[0].Get("finish_reason").String(),
		tokens: int(v[1].Get("completion_tokens").Int()), prompt: int(v[1].Get("prompt_tokens").Int()),
		id: v[2].String(), model: v[3].String(), created: v[4].Int(),
	}
	if v[1].IsObject() {
		a.usage = v[1].Raw
	}
	return a, nil
}

// add takes in a chunk's answer and decides whether the decode ended: on a
// terminal finish_reason, an empty chunk, the budget spent or the last
// chunk allowed.
func (d *Decode) add(a answer) {
	if d.chunks == 1 {
		d.first = a
	}
	d.last = a
	d.text.WriteString(a.text)
	d.tokens += a.tokens
	d.ended = (a.finish != "" && a.finish != "length") || (a.tokens == 0 && a.text == "") ||
		(d.plan.budget > 0 && d.tokens >= d.plan.budget) || d.chunks >= MaxChunks
}

// body is the next chunk's request (Next).
func (d *Decode) body() ([]byte, error) {
	k := d.plan.size
	if d.plan.budget > 0 {
		k = min(k, d.plan.budget-d.tokens)
	}
	kb := strconv.AppendInt(nil, int64(k), 10)
	edits := []connectors.Edit{
		{Key: "stream", Raw: []byte("false")},
		{Key: "stream_options", Delete: true},
		{Key: "max_tokens", Raw: kb},
		{Key: "max_completion_tokens", Raw: kb},
	}
	if d.plan.hasMin {
		edits = append(edits, connectors.Edit{Key: "min_tokens", Raw: strconv.AppendInt(nil, int64(min(max(d.plan.minTokens-d.tokens, 0), k)), 10)})
	}
	if d.chunks > 0 {
		edits = append(edits,
			connectors.Edit{Key: "kv_transfer_params", Delete: true},
			connectors.Edit{Key: "continue_final_message", Raw: []byte("true")},
			connectors.Edit{Key: "add_generation_prompt", Raw: []byte("false")},
			connectors.Edit{Key: "messages", Raw: d.messages()},
		)
	}
	return connectors.EditObject(nil, d.orig, edits)
}

// messages is the client's messages with the one assistant message made
// so far at the end.
func (d *Decode) messages() []byte {
	m := d.plan.messages
	b := make([]byte, 0, len(m)+d.text.Len()+48)
	b = append(b, m[:strings.LastIndexByte(m, ']')]...)
	if !d.plan.empty {
		b = append(b, ',')
	}
	b = append(b, `{"role":"assistant","content":`...)
	b = appendJSONString(b, d.text.String())
	return append(b, "}]"...)
}

// usage is the decode's usage: the first chunk's (its prompt tokens and
// details) with the completion tokens of all chunks.
func (d *Decode) usage() []byte {
	prompt := d.first.prompt
	ct := strconv.AppendInt(nil, int64(d.tokens), 10)
	tt := strconv.AppendInt(nil, int64(prompt+d.tokens), 10)
	if d.first.usage != "" {
		if u, err := connectors.EditObject(nil, []byte(d.first.usage), []connectors.Edit{
			{Key: "completion_tokens", Raw: ct}, {Key: "total_tokens", Raw: tt},
		}); err == nil {
			return u
		}
	}
	return fmt.Appendf(nil, `{"prompt_tokens":%d,"completion_tokens":%s,"total_tokens":%s}`, prompt, ct, tt)
}

// JSON is the JSON answer: the last chunk's, with its first choice holding
// the whole message and the usage summed.
func (d *Decode) JSON() []byte {
	content := appendJSONString(nil, d.text.String())
	choice, err := connectors.EditObject(nil, []byte(gjson.Get(d.last.json, "choices.0").Raw), []connectors.Edit{
		{Key: "message", Nested: []connectors.Edit{{Key: "content", Raw: content}}},
	})
	if err != nil {
		choice = []byte(gjson.Get(d.last.json, "choices.0").Raw)
	}
	choices := append(append([]byte{'['}, choice...), ']')
	out, err := connectors.EditObject(nil, []byte(d.last.json), []connectors.Edit{
		{Key: "choices", Raw: choices}, {Key: "usage", Raw: d.usage()},
	})
	if err != nil {
		return []byte(d.last.json)
	}
	return out
}

// event appends one chat.completion.chunk event of the decode: a delta
// (role and/or content) or, with finish, the closing choice; usage, when
// set, makes it the usage chunk (no choices).
func (d *Decode) event(b []byte, role bool, content string, finish string, usage []byte) []byte {
	b = append(b, `data: {"id":`...)
	b = appendJSONString(b, d.first.id)
	b = append(b, `,"object":"chat.completion.chunk","created":`...)
	b = strconv.AppendInt(b, d.first.created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, d.first.model)
	if usage != nil {
		b = append(b, `,"choices":[],"usage":`...)
		b = append(b, usage...)
		return append(b, "}\n\n"...)
	}
	b = append(b, `,"choices":[{"index":0,"delta":{`...)
	sep := ""
	if role {
		b = append(b, `"role":"assistant"`...)
		sep = ","
	}
	if content != "" || role {
		b = append(b, sep...)
		b = append(b, `"content":`...)
		b = appendJSONString(b, content)
	}
	b = append(b, `},"logprobs":null,"finish_reason":`...)
	if finish == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, finish)
	}
	return append(b, "}]}\n\n"...)
}

// OpenEvent appends the stream's first event: the role and the first
// chunk's text.
func (d *Decode) OpenEvent(b []byte) []byte { return d.event(b, true, d.first.text, "", nil) }

// TextEvent appends the event of the last chunk's text; nothing when it
// has none.
func (d *Decode) TextEvent(b []byte) []byte {
	if d.last.text == "" {
		return b
	}
	return d.event(b, false, d.last.text, "", nil)
}

// CloseEvents appends the stream's end: the finish_reason, the usage chunk
// when the client asked for it (usage), [DONE].
func (d *Decode) CloseEvents(b []byte, usage bool) []byte {
	b = d.event(b, false, "", d.last.finish, nil)
	if usage {
		b = d.event(b, false, "", "", d.usage())
	}
	return append(b, "data: [DONE]\n\n"...)
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
}
