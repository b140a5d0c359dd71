// Package shortprompt is the short-prompt guard (--min-remote-prefill-tokens),
// a request feature: a request that names a prefiller but whose prompt is
// shorter than the threshold is served locally, with no prefill leg and no
// KV transfer, since moving a short prompt's KV costs more than the prefill
// it saves. It is decided once the header was parsed and allowed (a refused
// or malformed value is answered as it would be with any prompt) and before
// the prefiller's circuit breaker and any leg, on both serving paths. A
// declined request is no fallback: it is counted in mode local and in
// split_declined_total, and reported as declined.
package shortprompt

import (
	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// Guard is the short-prompt guard: registered when
// --min-remote-prefill-tokens is above 0.
type Guard struct {
	// Limit is the fewest prompt tokens (estimated) a split is worth.
	Limit int
}

// Begin declines the split of a request that names a prefiller and whose
// prompt is shorter than the limit, and logs it. It costs one pass over
// the body's top level (connectors.EstimatePromptTokens); a prompt the
// estimate cannot read is not declined.
func (s Guard) Begin(r feature.Request, _ feature.Head) feature.Use {
	if r.Prefiller == "" {
		return nil
	}
	n, ok := connectors.EstimatePromptTokens(r.API, r.Body)
	if !ok || n >= s.Limit {
		return nil
	}
	r.Log.LogAt(zerolog.DebugLevel).Int("prompt_tokens_estimate", n).Int("min_remote_prefill_tokens", s.Limit).
		Msg("short prompt: split declined, served locally")
	return declinedShort{}
}

// declinedShort is a split the short-prompt guard declined.
type declinedShort struct{}

func (declinedShort) DeclinedSplit() string { return metrics.DeclineShortPrompt }

var (
	_ feature.Feature       = Guard{}
	_ feature.SplitDecliner = declinedShort{}
)
