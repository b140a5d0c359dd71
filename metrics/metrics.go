// Package metrics declares every Prometheus metric the sidecar exports, once.
// Collectors are registered on a registry the caller passes in; there is no
// global state.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Request modes (the mode label of requests_total and ttft_seconds).
const (
	// ModeDisaggregated: prefilled remotely, KV handed to the local decode.
	ModeDisaggregated = "disaggregated"
	// ModeLocal: no prefiller was named, or the sidecar declined the split
	// (see split_declined_total); the local engine did everything.
	ModeLocal = "local"
	// ModeFallback: a prefiller was named but the request degraded to a local
	// prefill (see fallbacks_total for why).
	ModeFallback = "fallback"
)

// Outcomes of a request that named an admitted prefiller (the outcome label
// of prefiller_requests_total), one each.
const (
	// OutcomeSplit: a decode ran on KV that moved from the prefiller.
	OutcomeSplit = "split"
	// OutcomeNoHandoff: answered 2xx/3xx without a KV handoff: the
	// prefill's first token ended generation, or a decode-first engine
	// served it from its own cache.
	OutcomeNoHandoff = "no_handoff"
	// OutcomeFallback: degraded to a local prefill, and answered.
	OutcomeFallback = "fallback"
	// OutcomeRefused: answered 4xx (passed on from the prefiller, or
	// refused by the sidecar).
	OutcomeRefused = "refused"
	// OutcomeFailed: answered 5xx, or the client left first.
	OutcomeFailed = "failed"
)

// Inflight phases (the phase label of inflight_requests).
const (
	// PhasePrefill: the prefill leg is in flight.
	PhasePrefill = "prefill"
	// PhaseDecode: the decode leg with remote KV is in flight.
	PhaseDecode = "decode"
	// PhaseLocal: a local (or fallback) run is in flight.
	PhaseLocal = "local"
	// PhasePassthrough: a non-inference request to the local engine.
	PhasePassthrough = "passthrough"
)

// Reasons the sidecar declines to split a request that named a prefiller
// (the reason label of split_declined_total). A declined request is served
// locally (mode local): it is no fallback, nothing failed.
const (
	// DeclineShortPrompt: the prompt is estimated shorter than
	// --min-remote-prefill-tokens; moving its KV would cost more than the
	// prefill it saves.
	DeclineShortPrompt = "short_prompt"
	// DeclinePreviousResponse: a /v1/responses request names a
	// previous_response_id, a conversation whose history only the engine
	// that answered it holds, the decode engine; a prefill engine has none
	// of it.
	DeclinePreviousResponse = "previous_response"
)

// KV cache source outcomes (the outcome label of kv_sources_total): what
// became of an x-kv-cache-source-host-port header the P2P tier honours.
const (
	// KVSourceUsed: the source was named to an engine (remote_kv_source).
	KVSourceUsed = "used"
	// KVSourcePrefiller: the source is the request's prefiller, which
	// holds the prompt itself; not named.
	KVSourcePrefiller = "prefiller"
	// KVSourceOwnRank: the source is the rank serving the request; not
	// named.
	KVSourceOwnRank = "own_rank"
	// KVSourceNotAllowed: the source is not on the SSRF allowlist; ignored.
	KVSourceNotAllowed = "not_allowed"
	// KVSourceMalformed: the header names no usable host[:port]; ignored.
	KVSourceMalformed = "malformed"
)

// KV release outcomes (the how label of kv_releases_total): what became of
// a prefill handoff whose decode never read the KV (--release-kv-on-cancel).
const (
	// KVReleaseDecodeLeg: a one-token decode leg read the KV; the
	// prefiller freed it.
	KVReleaseDecodeLeg = "decode_leg"
	// KVReleaseFailed: the release leg failed (transport error, timeout,
	// non-200, or a body that could not be built); the prefiller keeps the
	// KV until its own timeout.
	KVReleaseFailed = "failed"
	// KVReleaseOverLimit: not sent, as many release legs were in flight as
	// allowed.
	KVReleaseOverLimit = "over_limit"
)

// Metrics holds the sidecar's collectors.
type Metrics struct {
	// Requests counts finished inference requests by mode and status code.
	Requests *prometheus.CounterVec
	// Fallbacks counts degradations to local prefill by reason.
	Fallbacks *prometheus.CounterVec
	// PrefillerRequests counts the requests that named an admitted
	// prefiller, by prefiller, outcome (Outcome*) and, for a fallback, its
	// reason: the split and fallback ratios per prefiller.
	PrefillerRequests *prometheus.CounterVec
	// SplitDeclined counts requests that named a prefiller and that the
	// sidecar served locally by choice, without a prefill leg, by reason
	// (DeclineShortPrompt, DeclinePreviousResponse).
	SplitDeclined *prometheus.CounterVec
	// PrefillDuration observes the whole prefill phase (retries included)
	// per prefiller, successful or not.
	PrefillDuration *prometheus.HistogramVec
	// KVTransferDuration observes, per prefiller, the engine-pull handoff:
	// from sending the decode leg to its first byte of output (response
	// head for JSON, first non-preamble event for SSE), i.e. the KV pull
	// plus the first decode step.
	KVTransferDuration *prometheus.HistogramVec
	// TTFT observes the time from request arrival to the first byte of the
	// answer written to the client, by mode.
	TTFT *prometheus.HistogramVec
	// KVLoadFailures counts decode legs whose KV load failed, per prefiller.
	KVLoadFailures *prometheus.CounterVec
	// Inflight is the number of requests in each phase.
	Inflight *prometheus.GaugeVec
	// PrefillRetries counts prefill attempts retried after a retryable error.
	PrefillRetries *prometheus.CounterVec
	// ClientDisconnects counts requests whose client left before the answer
	// was complete, by the phase it was in.
	ClientDisconnects *prometheus.CounterVec
	// KVReleases counts prefill handoffs whose decode never read the KV
	// (the client left first) by what the sidecar did to free the
	// prefiller's blocks (KVReleaseDecodeLeg, ...).
	KVReleases *prometheus.CounterVec
	// PrefillLegFailures counts prefill legs of a concurrent choreography
	// (sglang, mooncake, offloading) that failed, by reason (a fallback reason, or
	// "rejected" for a 4xx).
	PrefillLegFailures *prometheus.CounterVec
	// DecodeFirst counts decode-first attempts (shared-storage with
	// cache_hit_threshold) by outcome: served, declined.
	DecodeFirst *prometheus.CounterVec
	// KVSources counts x-kv-cache-source-host-port headers the P2P tier
	// honours, by outcome (KVSourceUsed, ...).
	KVSources *prometheus.CounterVec
	// LoopStreams is the number of open streams carried by the event loops
	// (holding no goroutine or buffer).
	LoopStreams prometheus.Gauge
	// LoopHandoffs counts streams handed to an event loop.
	LoopHandoffs prometheus.Counter
	// LoopRequests counts inference requests served on the event loops
	// from their first byte to their last (the lane: local and P/D
	// requests whose head came whole in the first read), as the lane takes
	// each: before any byte of its answer.
	LoopRequests prometheus.Counter
	// Prewarms counts warm-up splits to newly seen prefillers by result
	// (prewarm.go).
	Prewarms *prometheus.CounterVec
	// Multiturn is multi-turn KV reuse's (--enable-bidirectional-kv-xfer).
	Multiturn *Multiturn
	// Prefillers bounds the prefiller label.
	Prefillers *Bounded
	// Guards are the request guards' collectors (guards.go).
	Guards *Guards
	// Chunked are the chunked decode's collectors (chunked.go).
	Chunked *Chunked
	// Encoder are the encoder stage's collectors (encoder.go).
	Encoder *Encoder
	// MoriIO are MoRI-IO's DNS collectors (moriio.go).
	MoriIO *MoriIO
	// Hedge are hedged prefill's collectors (hedge.go).
	Hedge *Hedge
	// Upstream counts upstream answers refused (upstream.go).
	Upstream *Upstream
	// Wire are the collectors of the engines' wire (wire.go).
	Wire *Wire
}

// RegisterBuildInfo registers pd_sidecar_build_info{version,revision,go_version}
// on reg: a gauge at 1 that says which build is running.
func RegisterBuildInfo(reg prometheus.Registerer, version, revision, goVersion string) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pd_sidecar_build_info",
		Help: "The running build: module version, VCS revision and Go version (always 1).",
	}, []string{"version", "revision", "go_version"})
	reg.MustRegister(g)
	g.WithLabelValues(version, revision, goVersion).Set(1)
}

var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// New creates the collectors and registers them on reg. maxPrefillers
// bounds the distinct prefiller label values (then "other"); <= 0 means 64.
func New(reg prometheus.Registerer, maxPrefillers int) *Metrics {
	if maxPrefillers <= 0 {
		maxPrefillers = 64
	}
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_requests_total",
			Help: "Inference requests answered, by mode (disaggregated, local, fallback) and HTTP status code.",
		}, []string{"mode", "code"}),
		Fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_fallbacks_total",
			Help: "Requests with a named prefiller that degraded to local prefill, by reason.",
		}, []string{"reason"}),
		PrefillerRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_prefiller_requests_total",
			Help: "Requests that named an admitted prefiller, by prefiller and outcome (split, no_handoff, fallback, refused, failed); reason is a fallback's reason, empty otherwise.",
		}, []string{"prefiller", "outcome", "reason"}),
		SplitDeclined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_split_declined_total",
			Help: "Requests with a named prefiller served locally by choice, without a prefill leg (no fallback), by reason (short_prompt: under --min-remote-prefill-tokens; previous_response: a /v1/responses previous_response_id, history held by the decode engine).",
		}, []string{"reason"}),
		PrefillDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pd_sidecar_prefill_duration_seconds",
			Help:    "Duration of the prefill phase on the remote prefiller (all attempts), successful or not.",
			Buckets: latencyBuckets,
		}, []string{"prefiller"}),
		KVTransferDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pd_sidecar_kv_transfer_duration_seconds",
			Help:    "Engine-pull KV handoff: decode leg sent to its first output byte (KV pull plus first decode step).",
			Buckets: latencyBuckets,
		}, []string{"prefiller"}),
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pd_sidecar_ttft_seconds",
			Help:    "Request arrival to the first answer byte written to the client, by mode.",
			Buckets: latencyBuckets,
		}, []string{"mode"}),
		KVLoadFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_kv_load_failures_total",
			Help: "Decode legs whose KV load from the prefiller failed, by prefiller.",
		}, []string{"prefiller"}),
		Inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pd_sidecar_inflight_requests",
			Help: "Requests in flight, by phase (prefill, decode, local, passthrough).",
		}, []string{"phase"}),
		PrefillRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_prefill_retries_total",
			Help: "Prefill attempts retried after a retryable error, by prefiller.",
		}, []string{"prefiller"}),
		ClientDisconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_client_disconnects_total",
			Help: "Requests whose client left before the answer was complete; upstream legs were cancelled.",
		}, []string{"phase"}),
		KVReleases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_kv_releases_total",
			Help: "Prefill handoffs whose decode leg never read the KV (the client left first), by how the prefiller's blocks were freed: decode_leg (a one-token decode read them), failed, over_limit (not sent).",
		}, []string{"how"}),
		PrefillLegFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_prefill_leg_failures_total",
			Help: "Prefill legs sent concurrently with the decode leg (sglang, mooncake, offloading) that failed, by reason.",
		}, []string{"reason"}),
		KVSources: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_kv_sources_total",
			Help: "x-kv-cache-source-host-port headers honoured by the P2P tier (offloading, nixlv2 with --enable-p2p-pull), by outcome (used, prefiller, own_rank, not_allowed, malformed).",
		}, []string{"outcome"}),
		DecodeFirst: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_decode_first_total",
			Help: "Decode-first attempts (shared-storage with cache_hit_threshold), by outcome (served, declined).",
		}, []string{"outcome"}),
		LoopStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pd_sidecar_loop_streams",
			Help: "Open streams carried by the event loops (--stream-loops), which hold no goroutine or buffer per stream.",
		}),
		LoopHandoffs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pd_sidecar_loop_handoffs_total",
			Help: "Streams handed to an event loop after streaming 50 ms on their own goroutine.",
		}),
		LoopRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pd_sidecar_loop_requests_total",
			Help: "Inference requests served on the event loops from first byte to last (local and P/D requests whose head came whole in the first read).",
		}),
		Prewarms:   NewPrewarms(reg),
		Multiturn:  NewMultiturn(reg),
		Prefillers: NewBounded(maxPrefillers),
		Guards:     NewGuards(reg),
		Chunked:    NewChunked(reg),
		Encoder:    NewEncoder(reg),
		MoriIO:     NewMoriIO(reg),
		Hedge:      NewHedge(reg),
		Upstream:   NewUpstream(reg),
		Wire:       NewWire(reg),
	}
	reg.MustRegister(m.SplitDeclined)
	for _, r := range []string{DeclineShortPrompt, DeclinePreviousResponse} {
		m.SplitDeclined.WithLabelValues(r)
	}
	reg.MustRegister(m.PrefillLegFailures, m.KVSources, m.DecodeFirst, m.LoopStreams, m.LoopHandoffs, m.LoopRequests)
	reg.MustRegister(m.Requests, m.Fallbacks, m.PrefillerRequests, m.PrefillDuration, m.KVTransferDuration,
		m.TTFT, m.KVLoadFailures, m.Inflight, m.PrefillRetries, m.ClientDisconnects, m.KVReleases)
	for _, h := range []string{KVReleaseDecodeLeg, KVReleaseFailed, KVReleaseOverLimit} {
		m.KVReleases.WithLabelValues(h)
	}
	for _, o := range []string{KVSourceUsed, KVSourcePrefiller, KVSourceOwnRank, KVSourceNotAllowed, KVSourceMalformed} {
		m.KVSources.WithLabelValues(o)
	}
	for _, p := range []string{PhasePrefill, PhaseDecode, PhaseLocal, PhasePassthrough} {
		m.Inflight.WithLabelValues(p)
	}
	return m
}
