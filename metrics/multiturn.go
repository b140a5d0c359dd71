package metrics

import "github.com/prometheus/client_golang/prometheus"

// What happened to a decode answer's kv_transfer_params with multi-turn KV
// reuse on (the outcome label of pd_sidecar_multiturn_entries_total).
const (
	// MultiturnKept: kept for the conversation's next turn.
	MultiturnKept = "kept"
	// MultiturnRefused: refused (a member not documented, of another type
	// or past its bounds, an address that is not this pod's); nothing kept.
	MultiturnRefused = "refused"
	// MultiturnNotKept: the answer cannot be extended exactly (more than
	// one choice, tool calls, an unfinished or cut answer); nothing kept.
	MultiturnNotKept = "not_kept"
	// MultiturnEvicted: an entry dropped for room before it was used.
	MultiturnEvicted = "evicted"
)

// Why an entry was dropped for room (the reason label of
// pd_sidecar_multiturn_evictions_total).
const (
	// MultiturnEvictedShare: the client that kept a new entry held its
	// share (--bidirectional-cache-client-share); its own oldest went.
	MultiturnEvictedShare = "client_share"
	// MultiturnEvictedOverShare: the oldest entry of a client over its
	// share went, for a client under its own.
	MultiturnEvictedOverShare = "over_share"
	// MultiturnEvictedFull: the store was full and no client over its
	// share; the least recently kept went.
	MultiturnEvictedFull = "full"
)

// How a release leg for a pinned history no turn will read went (the
// outcome label of pd_sidecar_multiturn_pin_releases_total).
const (
	// PinReleaseSent: a prefill engine answered the release leg: it was
	// given the pin to read, pulled nothing, and told the decode engine to
	// free it.
	PinReleaseSent = "sent"
	// PinReleaseFailed: the release leg failed (transport, timeout, a
	// status other than 200); the pin lasts its TTL.
	PinReleaseFailed = "failed"
	// PinReleaseOverLimit: not sent, as many release legs were in flight
	// as allowed; the pin lasts its TTL.
	PinReleaseOverLimit = "over_limit"
	// PinReleaseNotAllowed: not sent, as the split's prefiller is no
	// longer on the allowlist; the pin lasts its TTL.
	PinReleaseNotAllowed = "not_allowed"
)

// Why a conversation's turn carries no history in its prefill leg (the
// reason label of pd_sidecar_multiturn_misses_total).
const (
	// MultiturnNoEntry: the session has no entry (its first turn, one whose
	// entry was used, evicted, or never kept).
	MultiturnNoEntry = "no_entry"
	// MultiturnExpired: the entry outlived --bidirectional-cache-ttl.
	MultiturnExpired = "expired"
	// MultiturnPrefixMismatch: the turn does not extend the sequence the
	// decode engine saw and produced (an edited or stripped history,
	// another conversation's session key).
	MultiturnPrefixMismatch = "prefix_mismatch"
	// MultiturnBelowThreshold: the history holds fewer tokens than
	// --bidirectional-recompute-threshold.
	MultiturnBelowThreshold = "below_threshold"
	// MultiturnPullFailed: the prefill with the history failed; it ran
	// again without it.
	MultiturnPullFailed = "pull_failed"
)

// Multiturn is multi-turn KV reuse's (--enable-bidirectional-kv-xfer).
type Multiturn struct {
	// Uses counts turns whose prefill carried the conversation's history
	// and whose decode answered.
	Uses prometheus.Counter
	// Misses counts turns of a conversation whose prefill carried no
	// history, by reason (no_entry, expired, prefix_mismatch,
	// below_threshold, pull_failed).
	Misses *prometheus.CounterVec
	// TokensReused counts the history tokens of those uses: tokens the
	// prefiller did not compute again.
	TokensReused prometheus.Counter
	// Entries counts what became of decode answers' kv_transfer_params.
	Entries *prometheus.CounterVec
	// Held is the number of conversations' entries held now.
	Held prometheus.Gauge
	// Evictions counts entries dropped for room before they were used, by
	// reason (client_share, over_share, full).
	Evictions *prometheus.CounterVec
	// PinReleases counts the release legs sent for pinned histories no
	// turn will read, by outcome (sent, failed, over_limit).
	PinReleases *prometheus.CounterVec
	// PinnedTokens estimates the tokens the decode engine holds pinned for
	// next turns: every pin the answers announced, until a prefill read it
	// or decoder_kv_blocks_ttl passed.
	PinnedTokens prometheus.Gauge
}

// NewMultiturn creates multi-turn KV reuse's metrics and registers them on
// reg, every label value exported from the start.
func NewMultiturn(reg prometheus.Registerer) *Multiturn {
	m := &Multiturn{
		Uses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pd_sidecar_multiturn_uses_total",
			Help: "Turns whose prefill carried the conversation's history (the decode engine's KV of the previous turn, --enable-bidirectional-kv-xfer) and whose decode answered.",
		}),
		Misses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_multiturn_misses_total",
			Help: "Turns of a conversation (a session key) whose prefill carried no history, by reason (no_entry, expired, prefix_mismatch, below_threshold, pull_failed).",
		}, []string{"reason"}),
		TokensReused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pd_sidecar_multiturn_tokens_reused_total",
			Help: "History tokens of the turns that used one: prompt tokens the prefiller pulled instead of computing again.",
		}),
		Entries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_multiturn_entries_total",
			Help: "Decode answers' kv_transfer_params of conversations, by outcome (kept, refused, not_kept, evicted).",
		}, []string{"outcome"}),
		Held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pd_sidecar_multiturn_entries",
			Help: "Conversations whose next turn may use the decode engine's KV now.",
		}),
		Evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_multiturn_evictions_total",
			Help: "Conversations' entries dropped for room before they were used, by reason: client_share (the client that kept a new entry held its share, and gave its own oldest), over_share (a client over its share gave its oldest to one under its own), full (no client over its share; the least recently kept).",
		}, []string{"reason"}),
		PinReleases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_multiturn_pin_releases_total",
			Help: "Release legs for histories the decode engine pinned that no turn will read (an answer not kept, an entry evicted, replaced or under the recompute threshold; --bidirectional-release-unread): a one-token prefill leg given the pin, whose engine pulls nothing and tells the decode engine to free it, by outcome (sent, failed, over_limit, not_allowed).",
		}, []string{"outcome"}),
		PinnedTokens: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pd_sidecar_multiturn_pinned_tokens",
			Help: "Estimate of the tokens the decode engine holds pinned for next turns (bidirectional KV transfer): those the decode answers said were pinned (remote_num_tokens), kept or not, until a prefill read them or --bidirectional-cache-ttl (the engines' decoder_kv_blocks_ttl) passed.",
		}),
	}
	reg.MustRegister(m.Uses, m.Misses, m.TokensReused, m.Entries, m.Held, m.Evictions, m.PinnedTokens, m.PinReleases)
	for _, o := range []string{PinReleaseSent, PinReleaseFailed, PinReleaseOverLimit, PinReleaseNotAllowed} {
		m.PinReleases.WithLabelValues(o)
	}
	for _, r := range []string{MultiturnEvictedShare, MultiturnEvictedOverShare, MultiturnEvictedFull} {
		m.Evictions.WithLabelValues(r)
	}
	for _, r := range []string{MultiturnNoEntry, MultiturnExpired, MultiturnPrefixMismatch, MultiturnBelowThreshold, MultiturnPullFailed} {
		m.Misses.WithLabelValues(r)
	}
	for _, o := range []string{MultiturnKept, MultiturnRefused, MultiturnNotKept, MultiturnEvicted} {
		m.Entries.WithLabelValues(o)
	}
	return m
}
