package connectors

import "github.com/tidwall/gjson"

// BodyTop is what the sidecar reads of a request body's top level, in the
// pass that validates it (ScanBody): the client connector fields there and
// the stream flags.
type BodyTop struct {
	// Fields are the client connector fields an engine of the API reads
	// (FindClientFields).
	Fields ClientFields
	// Stream and Usage are the top-level "stream" and
	// "stream_options.include_usage": each true, false or null (absent:
	// false), else the body is refused, since engines read other values
	// differently (vLLM's pydantic takes "yes", "on" and 1 for true, Go
	// engines refuse them).
	Stream, Usage bool
}

// ScanBody validates body as ValidObject does and, in the same pass, reads
// its BodyTop for api: a prompt of any length is read once for both. On
// /inference/v1/generate, whose engines also read connector fields nested
// in sampling_params.extra_args, the fields take a second pass
// (FindClientFields).
func ScanBody(api API, body []byte) (BodyTop, error) {
	var top BodyTop
	if err := validate(body, &top); err != nil {
		return BodyTop{}, err
	}
	if api == APIGenerate {
		f, err := FindClientFields(api, body)
		if err != nil {
			return BodyTop{}, err
		}
		top.Fields = f
	}
	return top, nil
}

// member takes one top-level member: its raw (still escaped) name and raw
// value, both validated. It returns what makes the body ambiguous ("":
// nothing): a stream flag that is not a JSON boolean or null.
func (t *BodyTop) member(name, value []byte) string {
	if i := clientField(name); i >= 0 {
		t.Fields |= 1 << i
	}
	switch {
	case nameIs(name, "stream"): // once: a repeated name is refused first
		v := gjson.ParseBytes(value)
		if !isFlag(v) {
			return "stream is not true, false or null"
		}
		t.Stream = v.Type == gjson.True
	case nameIs(name, "stream_options"):
		v := gjson.GetBytes(value, "include_usage")
		if v.Exists() && !isFlag(v) {
			return "stream_options.include_usage is not true, false or null"
		}
		t.Usage = v.Type == gjson.True
	}
	return ""
}

// isFlag reports whether v is a JSON boolean or null.
func isFlag(v gjson.Result) bool {
	return v.Type == gjson.True || v.Type == gjson.False || v.Type == gjson.Null
}
