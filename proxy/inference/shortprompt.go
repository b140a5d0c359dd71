package inference

import (
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// The short-prompt guard (--min-remote-prefill-tokens): a request that
// names a prefiller but whose prompt is shorter than the threshold is
// served locally, with no prefill leg and no KV transfer, since moving a
// short prompt's KV costs more than the prefill it saves. It is decided
// once the header was parsed and allowed (a refused or malformed value is
// answered as it would be with any prompt) and before the prefiller's
// circuit breaker and any leg, on both serving paths. A declined request is no fallback: it is counted in
// mode local and in split_declined_total, and reported as declined.

// shortPrompt is the short-prompt guard, a request feature: registered
// when --min-remote-prefill-tokens is above 0.
type shortPrompt struct{ limit int }

// begin declines the split of a request that names a prefiller and whose
// prompt is shorter than the limit, and counts and logs it; the request is
// then served locally. It costs one pass over the body's top level
// (connectors.EstimatePromptTokens); a prompt the estimate cannot read is
// not declined.
func (s shortPrompt) begin(r *Request, _ *fasthttp.RequestHeader) featureUse {
	if r.Prefiller == "" {
		return nil
	}
	n, ok := connectors.EstimatePromptTokens(r.API, r.Body)
	if !ok || n >= s.limit {
		return nil
	}
	r.P.M.SplitDeclined.WithLabelValues(metrics.DeclineShortPrompt).Inc()
	r.Obs.Declined = metrics.DeclineShortPrompt
	r.Mode = metrics.ModeLocal
	r.LogAt(zerolog.DebugLevel).Int("prompt_tokens_estimate", n).Int("min_remote_prefill_tokens", s.limit).
		Msg("short prompt: split declined, served locally")
	return declinedShort{}
}

// declinedShort is a split the short-prompt guard declined.
type declinedShort struct{}

func (declinedShort) declinesSplit() bool { return true }

var _ requestFeature = shortPrompt{}
