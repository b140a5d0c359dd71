// Package chunked runs a decode as a series of chunks (--decode-chunk-size
// N): the decode of a chat request becomes non-streamed requests of at
// most N tokens to the local engine, each continuing the one assistant
// message the earlier ones made (continue_final_message: true,
// add_generation_prompt: false), stitched into one answer, JSON or SSE,
// with the usage summed.
//
// The package decides whether and how a decode is cut (PlanFor), builds
// each chunk's body, reads and checks each chunk's answer, stitches them
// (Decode), and decides the decode's course (Machine): which chunk goes
// next, when the answer or the stream begins, what a failed chunk or a
// client that left does, how the decode ended and is counted. Both are
// without I/O. A driver executes the machine's actions: Run on the
// request's goroutine (behind Request: sending a chunk to the engine,
// writing the answer, the client's connection), or an event loop.
package chunked

import (
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// MaxChunks bounds the chunks of one decode. A budget larger than
// MaxChunks chunks gets larger chunks; a request with no budget ends after
// MaxChunks chunks (finish_reason "length").
const MaxChunks = 256

// Plan is how a decode is cut.
type Plan struct {
	size      int // tokens per chunk
	budget    int // tokens in all (0: no budget)
	minTokens int // the client's min_tokens, spread over the chunks
	hasMin    bool
	messages  string // the client's messages (a JSON array)
	empty     bool   // messages is an empty array
}

// Size is the tokens each chunk asks for (the last asks for at most what
// the budget has left).
func (p Plan) Size() int { return p.size }

// Budget is the tokens the decode may make in all (0: no budget).
func (p Plan) Budget() int { return p.budget }

// PlanFor reports whether the decode of a chat body is chunked with chunks
// of n tokens (n <= 0: chunking is off), and how. A budget
// (max_completion_tokens, else max_tokens) of at most one chunk is one
// plain request; so is a request the stitching cannot represent (n > 1,
// logprobs, or a client's own continue_final_message), and one whose cap
// is not a positive integer (the engine refuses it, as unchunked). Which
// requests may be chunked at all (their API, their route) is the
// caller's to decide.
func PlanFor(body []byte, n int) (Plan, bool) {
	if n <= 0 {
		return Plan{}, false
	}
	v := gjson.GetMany(connectors.Bytes(body), "max_completion_tokens", "max_tokens", "n", "logprobs",
		"continue_final_message", "min_tokens", "messages")
	budget := 0
	for _, lim := range v[:2] {
		switch {
		case lim.Type == gjson.Null:
			continue // absent, or null: no cap
		case lim.Type != gjson.Number || lim.Int() < 1:
			return Plan{}, false // the engine's to refuse, as it would
		case budget == 0:
			budget = int(lim.Int())
		}
	}
	if (budget > 0 && budget <= n) || (v[2].Exists() && v[2].Int() != 1) || v[3].Bool() || v[4].Bool() || !v[6].IsArray() {
		return Plan{}, false
	}
	size := n
	if budget > 0 && (budget+n-1)/n > MaxChunks {
		size = (budget + MaxChunks - 1) / MaxChunks
	}
	return Plan{
		size: size, budget: budget, minTokens: int(v[5].Int()), hasMin: v[5].Type == gjson.Number,
		messages: v[6].Raw, empty: len(v[6].Array()) == 0,
	}, true
}
