package status

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// Verdicts: the one-word state of disaggregation in a Snapshot. A request
// counts as split only when a decode ran on KV that moved from its
// prefiller.
const (
	// VerdictIdle: no inference request in the window (and, since start,
	// either none named a prefiller or one was split); or nothing to split:
	// every request that named a prefiller was declined (Counts.Declined).
	VerdictIdle = "idle"
	// VerdictNotConfigured: requests arrived but none named a prefiller:
	// nothing asks for P/D (the endpoint picker's P/D decision is off, or
	// the header never reaches the sidecar).
	VerdictNotConfigured = "not-configured"
	// VerdictNotOperating: requests named a prefiller but none was split
	// (in the window; or, with an idle window, ever since start).
	VerdictNotOperating = "not-operating"
	// VerdictDegraded: some requests were split, some that named a
	// prefiller fell back or failed.
	VerdictDegraded = "degraded"
	// VerdictOperating: requests were split and KV moved for each, and
	// none that named a prefiller fell back or failed.
	VerdictOperating = "operating"
)

// Snapshot is the JSON answer of GET /debug/pd.
type Snapshot struct {
	// Connector and Transport are the configured KV connector and handoff.
	Connector string `json:"connector"`
	Transport string `json:"kv_transport"`
	// Now is when the snapshot was taken; UptimeSeconds since start.
	Now           time.Time `json:"now"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	// WindowSeconds is how far back the window counts reach.
	WindowSeconds float64 `json:"window_seconds"`
	// Window holds the counts of the last WindowSeconds.
	Window Counts `json:"window"`
	// SinceStart counts requests by mode since the process started.
	SinceStart map[string]int `json:"since_start"`
	// LastSplit and LastKVTransfer are the last successful split and the
	// last decode that produced output from remote KV (null: never).
	LastSplit      *time.Time `json:"last_split"`
	LastKVTransfer *time.Time `json:"last_kv_transfer"`
	// Prefillers is the per-prefiller health, most recently seen first.
	Prefillers []Prefiller `json:"prefillers"`
	// Engine and EngineVersion are the local engine's kind and version as
	// it last answered them (empty: not yet, or not asked).
	Engine        string `json:"engine,omitempty"`
	EngineVersion string `json:"engine_version,omitempty"`
	// UnknownKVMembers are the members of prefill answers' kv_transfer_params
	// the connector does not document, seen since start (passed on, or
	// refused with --kv-params-unknown-members=refuse).
	UnknownKVMembers []string `json:"kv_params_unknown_members,omitempty"`
	// Verdict is one of the Verdict* words; Summary says it in a sentence.
	Verdict string `json:"verdict"`
	Summary string `json:"summary"`
}

// Counts are the window's request counts.
type Counts struct {
	// Disaggregated, Local and Fallback count requests by mode.
	Disaggregated int `json:"disaggregated"`
	Local         int `json:"local"`
	Fallback      int `json:"fallback"`
	// NamedPrefiller counts requests that carried x-prefiller-host-port
	// (whatever its value), those declined excepted; the five outcomes
	// below sum to it.
	NamedPrefiller int `json:"named_prefiller"`
	// Split: a decode ran on KV that moved from the prefiller.
	Split int `json:"split"`
	// NoHandoff: answered without a KV handoff (the prefill's first token
	// ended generation; a decode-first engine served from its cache).
	NoHandoff int `json:"no_handoff"`
	// FellBack: degraded to a local prefill, and answered.
	FellBack int `json:"fell_back"`
	// Refused: answered 4xx (the prefiller's answer passed on, or the
	// sidecar's own refusal).
	Refused int `json:"refused"`
	// NamedFailed: answered 5xx, or the client left first.
	NamedFailed int `json:"named_failed"`
	// Declined counts requests that named a prefiller and that the sidecar
	// served locally by choice, with no prefill leg (counted in Local, not
	// in NamedPrefiller: no fallback, nothing failed); DeclinedByReason by
	// why (short_prompt: under --min-remote-prefill-tokens;
	// previous_response: a Responses previous_response_id).
	Declined         int            `json:"declined"`
	DeclinedByReason map[string]int `json:"declined_by_reason"`
	// KVTransferred counts decodes that produced output from remote KV
	// (equal to Split).
	KVTransferred int `json:"kv_transferred"`
	// Failed counts requests answered with 5xx (or whose client left).
	Failed int `json:"failed"`
	// FallbacksByReason counts degradations by reason.
	FallbacksByReason map[string]int `json:"fallbacks_by_reason"`
	// ChunkedDecodes counts decodes run as a series of chunks
	// (--decode-chunk-size); DecodeChunks their chunk requests.
	ChunkedDecodes int `json:"chunked_decodes"`
	DecodeChunks   int `json:"decode_chunks"`
	// EncoderStages counts requests through the encoder stage by outcome
	// (encoded, degraded, failed, no_items); empty when none.
	EncoderStages map[string]int `json:"encoder_stages,omitempty"`
	// Histories counts the prefills of conversations' turns by what
	// multi-turn KV reuse did (used, or why not: no_entry, expired,
	// prefix_mismatch, below_threshold, pull_failed); empty when none.
	Histories map[string]int `json:"multiturn_histories,omitempty"`
}

// Prefiller is the recent health of one prefiller.
type Prefiller struct {
	// Prefiller is the bounded label (host:port, or "other").
	Prefiller string `json:"prefiller"`
	// Circuit is the breaker state, or "n/a" when no breaker is wired.
	Circuit string `json:"circuit"`
	// CircuitLastProbe is when the open circuit was last probed
	// (--circuit-probe-interval); null when it is not open or not probed.
	CircuitLastProbe *time.Time `json:"circuit_last_probe"`
	// Splits and Fallbacks count outcomes since the entry was admitted.
	Splits    int `json:"splits"`
	Fallbacks int `json:"fallbacks"`
	// LastReason is the reason of the last fallback.
	LastReason string `json:"last_fallback_reason,omitempty"`
	// PrefillP50Ms, PrefillMaxMs, KVHandoffP50Ms summarise the last 32
	// observations (0: none).
	PrefillP50Ms   float64 `json:"prefill_p50_ms"`
	PrefillMaxMs   float64 `json:"prefill_max_ms"`
	KVHandoffP50Ms float64 `json:"kv_handoff_p50_ms"`
	// LastSeen, LastSuccess, LastFailure are null when never.
	LastSeen    *time.Time `json:"last_seen"`
	LastSuccess *time.Time `json:"last_success"`
	LastFailure *time.Time `json:"last_failure"`
}

// Snapshot returns the current picture.
func (t *Tracker) Snapshot() Snapshot {
	now := t.opts.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot{
		Connector: t.opts.Connector, Transport: t.opts.Transport,
		Now: now, UptimeSeconds: now.Sub(t.started).Seconds(),
		WindowSeconds: t.opts.Window.Seconds(),
		SinceStart:    maps.Clone(t.total),
		LastSplit:     timePtr(t.lastSplit), LastKVTransfer: timePtr(t.lastKV),
		Window: Counts{FallbacksByReason: map[string]int{}, DeclinedByReason: map[string]int{}},
	}
	oldest := now.Truncate(BucketWidth).Add(-t.opts.Window + BucketWidth)
	for i := range t.ring {
		b := &t.ring[i]
		if b.start.IsZero() || b.start.Before(oldest) || b.start.After(now) {
			continue
		}
		s.Window.Disaggregated += b.modes[metrics.ModeDisaggregated]
		s.Window.Local += b.modes[metrics.ModeLocal]
		s.Window.Fallback += b.modes[metrics.ModeFallback]
		s.Window.NamedPrefiller += b.named
		s.Window.Split += b.outcomes[outcomeSplit]
		s.Window.NoHandoff += b.outcomes[outcomeNoHandoff]
		s.Window.FellBack += b.outcomes[outcomeFellBack]
		s.Window.Refused += b.outcomes[outcomeRefused]
		s.Window.NamedFailed += b.outcomes[outcomeFailed]
		s.Window.KVTransferred += b.kvMoved
		s.Window.Failed += b.failed
		s.Window.ChunkedDecodes += b.chunked
		s.Window.DecodeChunks += b.chunks
		for k, v := range b.reasons {
			s.Window.FallbacksByReason[k] += v
		}
		for k, v := range b.declined {
			s.Window.Declined += v
			s.Window.DeclinedByReason[k] += v
		}
		for k, v := range b.history {
			if s.Window.Histories == nil {
				s.Window.Histories = map[string]int{}
			}
			s.Window.Histories[k] += v
		}
		for k, v := range b.encoder {
			if s.Window.EncoderStages == nil {
				s.Window.EncoderStages = map[string]int{}
			}
			s.Window.EncoderStages[k] += v
		}
	}
	for label, ps := range t.prefillers {
		s.Prefillers = append(s.Prefillers, t.prefillerView(label, ps))
	}
	slices.SortFunc(s.Prefillers, func(a, b Prefiller) int { return b.LastSeen.Compare(*a.LastSeen) })
	if w := t.opts.Wire; w != nil {
		s.Engine, s.EngineVersion = w.Engine()
		s.UnknownKVMembers = w.UnknownKVMembers()
	}
	s.Verdict, s.Summary = t.verdict(s)
	return s
}

func (t *Tracker) prefillerView(label string, ps *prefillerStat) Prefiller {
	v := Prefiller{
		Prefiller: label, Circuit: CircuitNA, Splits: ps.splits, Fallbacks: ps.fallbacks,
		LastReason: ps.lastReason, LastSeen: timePtr(ps.lastSeen),
		LastSuccess: timePtr(ps.lastSuccess), LastFailure: timePtr(ps.lastFailure),
	}
	if t.opts.Circuits != nil {
		if c := t.opts.Circuits.CircuitState(label); c != "" {
			v.Circuit = c
			v.CircuitLastProbe = timePtr(t.opts.Circuits.CircuitLastProbe(label))
		}
	}
	if d := ps.prefill.values(); len(d) > 0 {
		v.PrefillP50Ms, v.PrefillMaxMs = ms(d[len(d)/2]), ms(d[len(d)-1])
	}
	if d := ps.kv.values(); len(d) > 0 {
		v.KVHandoffP50Ms = ms(d[len(d)/2])
	}
	return v
}

// verdict says, in a word and in a sentence, whether requests are split.
func (t *Tracker) verdict(s Snapshot) (string, string) {
	w := s.Window
	total := w.Disaggregated + w.Local + w.Fallback
	win := fmt.Sprintf("the last %s", t.opts.Window)
	switch {
	case total == 0 && t.everNamed > 0 && t.everSplit == 0:
		return VerdictNotOperating, fmt.Sprintf("idle in %s; configured for P/D (%s) but no request has ever been split: none of the %d that named a prefiller since start had a decode on moved KV", win, s.Connector, t.everNamed)
	case total == 0:
		return VerdictIdle, fmt.Sprintf("no inference requests in %s", win)
	case w.NamedPrefiller == 0 && w.Declined > 0:
		return VerdictIdle, fmt.Sprintf("nothing to split in %s: %d requests named a prefiller and every one was declined (%s) and served locally (%d local)", win, w.Declined, reasonsText(w.DeclinedByReason), w.Local)
	case w.NamedPrefiller == 0:
		return VerdictNotConfigured, fmt.Sprintf("configured for P/D (%s) but not asked to split: %d requests in %s, none named a prefiller (x-prefiller-host-port); is the endpoint picker's P/D decision enabled?", s.Connector, total, win)
	case w.Split == 0:
		return VerdictNotOperating, fmt.Sprintf("configured for P/D (%s) but no split happened in %s: %d requests named a prefiller and none had a decode on moved KV: %s%s%s", s.Connector, win, w.NamedPrefiller, outcomesText(w), t.lastText(s), declinedText(w))
	case w.FellBack+w.NamedFailed > 0:
		return VerdictDegraded, fmt.Sprintf("%d of %d requests that named a prefiller in %s were split, KV moved for each; the others: %s%s", w.Split, w.NamedPrefiller, win, outcomesText(w), declinedText(w))
	}
	others := ""
	if w.Split < w.NamedPrefiller {
		others = "; the others: " + outcomesText(w)
	}
	return VerdictOperating, fmt.Sprintf("%d of %d requests that named a prefiller in %s were split, KV moved for each (%d local)%s%s", w.Split, w.NamedPrefiller, win, w.Local, others, declinedText(w))
}

// declinedText says, after a verdict's sentence, how many requests named
// a prefiller but were declined (not among the counts before it); "" when
// none was.
func declinedText(w Counts) string {
	if w.Declined == 0 {
		return ""
	}
	return fmt.Sprintf("; %d more named a prefiller but were declined (%s) and served locally", w.Declined, reasonsText(w.DeclinedByReason))
}

// outcomesText lists the window's outcomes other than split, with the
// fallback reasons.
func outcomesText(w Counts) string {
	var parts []string
	if w.FellBack > 0 {
		parts = append(parts, fmt.Sprintf("%d fell back to local prefill (%s)", w.FellBack, reasonsText(w.FallbacksByReason)))
	}
	if w.Refused > 0 {
		parts = append(parts, fmt.Sprintf("%d answered 4xx", w.Refused))
	}
	if w.NamedFailed > 0 {
		parts = append(parts, fmt.Sprintf("%d failed (5xx or client gone)", w.NamedFailed))
	}
	if w.NoHandoff > 0 {
		parts = append(parts, fmt.Sprintf("%d answered without a KV handoff", w.NoHandoff))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func (t *Tracker) lastText(s Snapshot) string {
	if s.LastSplit == nil {
		return "; no split since start"
	}
	return fmt.Sprintf("; last split %s ago", s.Now.Sub(*s.LastSplit).Round(time.Second))
}

// reasonsText lists reasons by count, largest first.
func reasonsText(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		if a < b {
			return -1
		}
		return 1
	})
	out := ""
	for i, k := range keys {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%s: %d", k, m[k])
	}
	if out == "" {
		return "no reason recorded"
	}
	return out
}

// ServeDebug answers GET /debug/pd with the Snapshot as JSON.
func (t *Tracker) ServeDebug(rc *fasthttp.RequestCtx) {
	if !rc.IsGet() && !rc.IsHead() {
		rc.SetStatusCode(fasthttp.StatusMethodNotAllowed)
		return
	}
	b, err := json.MarshalIndent(t.Snapshot(), "", "  ")
	if err != nil {
		rc.SetStatusCode(fasthttp.StatusInternalServerError)
		return
	}
	rc.SetContentType("application/json")
	rc.SetBody(append(b, '\n'))
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
