// Package prevresponse is the engine-held conversation guard, a request
// feature that is always on: a /v1/responses request whose
// previous_response_id is a string is served by the local (decode) engine
// alone, its split declined. Such a request carries no history in its
// body: the history is in the response store of the engine that answered
// the previous turn (vLLM's in-memory store, VLLM_ENABLE_RESPONSES_API_STORE;
// read at vllm-project/vllm 4d89a999
// vllm/entrypoints/openai/responses/serving.py, create_responses), and a
// turn served through this sidecar was answered by its decode engine, split
// or not. A prefill engine holds none of it: it answers 404 ("Response with
// id '...' not found.", the corpus shape
// vllm-responses-unknown-previous-4d89a999), which would reach the client as
// the prefiller's refusal; were it to answer, its KV would be of a prompt
// without the history, which the decode engine renders with it. So no split
// of such a request can be right, and the decode engine prefills it with
// the history it holds (or answers its own 404 for an id it does not hold).
//
// It is decided, as every decline, once the prefiller header was parsed and
// allowed, before the circuit breaker and any leg, on both serving paths;
// the decline is counted in mode local and split_declined_total
// {reason="previous_response"}, and logged at debug with the request id.
// previous_response_id null, absent or of another type names no previous
// response (vLLM reads null as none and refuses another type with 400,
// which the decode engine answers as well as a prefiller would).
package prevresponse

import (
	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// Member is the Responses request member that names the previous response.
const Member = "previous_response_id"

// Guard declines the split of a Responses request that continues a
// conversation the engine holds.
type Guard struct{}

// Begin declines the split of a /v1/responses request that names a
// prefiller and whose previous_response_id is a string, and logs it. It
// costs one look at the body's top level, for Responses requests naming a
// prefiller only; the body was checked whole before (one parse: a repeated
// name or a case variant of the member is refused first), so what it reads
// is what the engine reads.
func (Guard) Begin(r feature.Request, _ feature.Head) feature.Use {
	if r.Prefiller == "" || r.API != connectors.APIResponses {
		return nil
	}
	id := gjson.GetBytes(r.Body, Member)
	if id.Type != gjson.String {
		return nil
	}
	r.Log.LogAt(zerolog.DebugLevel).Str(Member, id.Str).
		Msg("previous_response_id: the conversation is held by the decode engine; split declined, served locally")
	return declined{}
}

// declined is a split the guard declined.
type declined struct{}

func (declined) DeclinedSplit() string { return metrics.DeclinePreviousResponse }

var (
	_ feature.Feature       = Guard{}
	_ feature.SplitDecliner = declined{}
)
