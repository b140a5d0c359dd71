package connectors

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// The encoder stage (llm-d's E/PD and E/P/D): the multimodal items of a
// chat request are encoded by encoder engines first, one item per request,
// and the request then runs on the prefill/decode engines, which find the
// encoded items (ec-example: in the encoder cache's shared storage;
// ec-nixl: by the ec_transfer_params the encoders answered). These are the
// stage's pure body transforms; the fan-out is proxy/encode.go's.

// Encoder-stage connectors (--ec-connector).
const (
	// ECExample is vLLM's ECExampleConnector (shared storage): the
	// encoders' answers are not read.
	ECExample = "ec-example"
	// ECNixl is vLLM's NIXL encoder-cache connector: each encoder answer's
	// ec_transfer_params are merged into the request's.
	ECNixl = "ec-nixl"
)

// mmTypes are the content-part types the encoder stage sends to encoders.
var mmTypes = [...]string{"image_url", "audio_url", "video_url", "input_audio"}

// MMItem is one multimodal content part of a request's messages.
type MMItem struct {
	// Type is the part's type (image_url, audio_url, video_url,
	// input_audio).
	Type string
	// Raw is the part's JSON object, as the client sent it.
	Raw []byte
}

// ErrECAnswer: an encoder's answer is not a JSON object.
var ErrECAnswer = errors.New("encoder answer is not a JSON object")

// MMItems returns the multimodal parts of body's messages[].content[] in
// order: parts of type image_url, audio_url, video_url and input_audio;
// URL parts (all but input_audio) deduplicated by <type>.url, as llm-d
// does (a URL part without a URL is never a duplicate). A body without
// messages, or whose contents are strings, has none.
func MMItems(body []byte) []MMItem {
	var items []MMItem
	seen := map[string]bool{}
	gjson.GetBytes(body, "messages").ForEach(func(_, msg gjson.Result) bool {
		msg.Get("content").ForEach(func(_, part gjson.Result) bool {
			if !part.IsObject() {
				return true
			}
			typ := part.Get("type").String()
			if !isMMType(typ) {
				return true
			}
			if typ != "input_audio" {
				if u := part.Get(typ + ".url"); u.Type == gjson.String && u.Str != "" {
					key := typ + "\x00" + u.Str
					if seen[key] {
						return true
					}
					seen[key] = true
				}
			}
			items = append(items, MMItem{Type: typ, Raw: []byte(part.Raw)})
			return true
		})
		return true
	})
	return items
}

func isMMType(t string) bool {
	for _, m := range mmTypes {
		if t == m {
			return true
		}
	}
	return false
}

// EncoderBody appends to dst the body of the encoder request of item: a
// copy of body with messages replaced by one user message holding the item
// alone, max_tokens 1 (and max_completion_tokens 1 when body has it),
// stream false and no stream_options.
func EncoderBody(dst, body []byte, item MMItem) ([]byte, error) {
	msgs := make([]byte, 0, len(item.Raw)+40)
	msgs = append(msgs, `[{"role":"user","content":[`...)
	msgs = append(msgs, item.Raw...)
	msgs = append(msgs, `]}]`...)
	edits := []Edit{
		{Key: "messages", Raw: msgs},
		{Key: "max_tokens", Raw: []byte("1")},
		{Key: "stream", Raw: []byte("false")},
		{Key: "stream_options", Delete: true},
	}
	if gjson.GetBytes(body, "max_completion_tokens").Exists() {
		edits = append(edits, Edit{Key: "max_completion_tokens", Raw: []byte("1")})
	}
	return EditObject(dst, body, edits)
}

// ECEntry is one entry of an ec-nixl encoder's ec_transfer_params, keyed
// by the item's mm_hash, as vLLM's ECCPUConnector writes it (every
// generation of the wirecorpus shapes vllm-ec-nixl-*): the encoder's host
// and port the prefill and decode engines fetch the encoding from
// (peer_host, peer_port; checked like any address an upstream names), its
// size, and per generation the encoder's NIXL agent metadata, the
// encoding's shape, the item's indices and its processor metadata (the
// consumer's own, passed as it is when it names no address). An entry
// with no address ({"metadata": {}}) announces an item the encoder holds
// nothing for: the consumer encodes it itself. The schema is Open: a
// member a later vLLM adds passes when it names no address.
var ECEntry = Schema{Name: "ec_transfer_params", Open: true, Fields: []Field{
	{Name: "peer_host", Kind: KindHost, Role: RoleHost},
	{Name: "peer_port", Kind: KindInt, Min: 1, Max: 65535, Role: RolePort},
	{Name: "size_bytes", Kind: KindInt, Min: 0, Max: 1 << 40},
	{Name: "nixl_agent_metadata_b64", Kind: KindID, Max: 1 << 20},
	{Name: "shape", Kind: KindInts, Min: 0, Max: 8},
	{Name: "item_indices", Kind: KindInts, Min: 0, Max: 1 << 12},
	{Name: "metadata", Kind: KindOpaque},
}}

// maxECEntries bounds the entries of one encoder answer (it encodes one
// item).
const maxECEntries = 64

// ECParamsOf returns the top-level ec_transfer_params object of an
// encoder's answer, written anew, and the addresses it names; nil when it
// is missing, null, not an object or empty. Each member's name must be an
// id (ValidID, unescaped, given once) and its value an ECEntry, at most
// maxECEntries of them; anything else, and an answer that is not a
// well-formed JSON object, is ErrECAnswer.
func ECParamsOf(answer []byte) ([]byte, []Addr, error) {
	if ValidObject(answer) != nil {
		return nil, nil, ErrECAnswer
	}
	v := gjson.GetBytes(answer, "ec_transfer_params")
	if !v.IsObject() {
		return nil, nil, nil
	}
	out := []byte{'{'}
	var addrs []Addr
	seen := map[string]bool{}
	var err error
	v.ForEach(func(k, e gjson.Result) bool {
		switch {
		case len(seen) >= maxECEntries:
			err = fmt.Errorf("%w: more than %d ec_transfer_params entries", ErrECAnswer, maxECEntries)
		case strings.IndexByte(k.Raw, '\\') >= 0 || !ValidID(k.Str):
			err = fmt.Errorf("%w: an ec_transfer_params key that is not an id", ErrECAnswer)
		case seen[k.Str]:
			err = fmt.Errorf("%w: an ec_transfer_params key given twice", ErrECAnswer)
		}
		if err != nil {
			return false
		}
		if len(seen) > 0 {
			out = append(out, ',')
		}
		seen[k.Str] = true
		out = strconv.AppendQuote(out, k.Str)
		out = append(out, ':')
		var a []Addr
		if out, a, err = ECEntry.Canonical(out, e); err != nil {
			err = fmt.Errorf("%w: %w", ErrECAnswer, err)
			return false
		}
		addrs = append(addrs, a...)
		return true
	})
	if err != nil {
		return nil, nil, err
	}
	if len(seen) == 0 {
		return nil, nil, nil
	}
	return append(out, '}'), addrs, nil
}

// MergeECParams merges the members of each object of parts, in order, into
// base (a JSON object, or nil for none): flat, a later member replacing an
// earlier one of the same name in place. nil when nothing is left.
func MergeECParams(base []byte, parts [][]byte) []byte {
	type member struct{ key, raw string }
	var ms []member
	at := map[string]int{}
	add := func(obj []byte) {
		gjson.ParseBytes(obj).ForEach(func(k, v gjson.Result) bool {
			if i, ok := at[k.Str]; ok {
				ms[i].raw = v.Raw
				return true
			}
			at[k.Str] = len(ms)
			ms = append(ms, member{k.Raw, v.Raw})
			return true
		})
	}
	if gjson.ParseBytes(base).IsObject() {
		add(base)
	}
	for _, p := range parts {
		add(p)
	}
	if len(ms) == 0 {
		return nil
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m.key)
		b.WriteByte(':')
		b.WriteString(m.raw)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// ECStageBody appends to dst body as it continues past the encoder stage:
// cache_hit_threshold 0 (as llm-d), and, when ec is not nil, ec_transfer_params
// set to ec (the merged object, see MergeECParams).
func ECStageBody(dst, body, ec []byte) ([]byte, error) {
	edits := []Edit{{Key: "cache_hit_threshold", Raw: []byte("0")}}
	if ec != nil {
		edits = append(edits, Edit{Key: "ec_transfer_params", Raw: ec})
	}
	out, err := EditObject(dst, body, edits)
	if err != nil {
		return nil, fmt.Errorf("encoder stage: %w", err)
	}
	return out, nil
}

// ECRequestID is the X-Request-Id of the encoder request of item idx of
// the request id (llm-d's "<id>-enc-<idx>").
func ECRequestID(id string, idx int) string { return id + "-enc-" + strconv.Itoa(idx) }
