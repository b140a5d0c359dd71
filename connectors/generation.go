package connectors

import (
	"fmt"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

// maxNamedMembers bounds the member names Generation lists.
const maxNamedMembers = 32

// Generation says which upstream generation the params object of a
// prefill answer is, for a log line: the shape of the repository's corpus
// (wirecorpus) whose members are exactly the object's, or that no shape
// has them, with the members (plain identifiers only, at most 32; the
// values are never named). connector is the --kv-connector reading it.
func Generation(connector string, params gjson.Result) string {
	if !params.IsObject() {
		return "not a JSON object"
	}
	var names []string
	odd := 0
	params.ForEach(func(k, _ gjson.Result) bool {
		switch {
		case !PlainName(k.Str) || strings.IndexByte(k.Raw, '\\') >= 0:
			odd++
		case len(names) < maxNamedMembers:
			names = append(names, k.Str)
		}
		return true
	})
	if odd == 0 {
		if s := wirecorpus.Generation(connector, wirecorpus.PrefillAnswer, names); s != "" {
			return "the upstream shape " + s
		}
	}
	out := "a generation the corpus does not know (members: " + strings.Join(names, ", ")
	if odd > 0 {
		out += fmt.Sprintf(", and %d not plain identifiers", odd)
	}
	return out + ")"
}
