package proxy

import (
	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// The short-prompt guard (--min-remote-prefill-tokens): a request that
// names a prefiller but whose prompt is shorter than the threshold is
// served locally, with no prefill leg and no KV transfer, since moving a
// short prompt's KV costs more than the prefill it saves. It is decided
// once the header was parsed and allowed (a refused or malformed value is
// answered as it would be with any prompt) and before the prefiller's
// circuit breaker and any leg, on both serving paths (serveInference and
// the lane's split). A declined request is no fallback: it is counted in
// mode local and in split_declined_total, and reported as declined.

// declineShort reports whether the request's split is declined for a short
// prompt, and then counts and logs it; the caller serves it locally. With
// the guard off it costs one comparison; on, one pass over the body's top
// level (connectors.EstimatePromptTokens). A prompt the estimate cannot
// read is not declined.
func (r *request) declineShort() bool {
	limit := r.p.cfg.MinRemotePrefillTokens
	if limit <= 0 {
		return false
	}
	n, ok := connectors.EstimatePromptTokens(r.api, r.body)
	if !ok || n >= limit {
		return false
	}
	r.p.m.SplitDeclined.WithLabelValues(metrics.DeclineShortPrompt).Inc()
	r.obs.declined = metrics.DeclineShortPrompt
	r.mode = metrics.ModeLocal
	r.logAt(zerolog.DebugLevel).Int("prompt_tokens_estimate", n).Int("min_remote_prefill_tokens", limit).
		Msg("short prompt: split declined, served locally")
	return true
}
