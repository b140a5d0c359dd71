package metrics

import "github.com/prometheus/client_golang/prometheus"

// Encoder-stage failure reasons (the reason label of
// pd_sidecar_encoder_failures_total), a closed set.
const (
	// EncoderUnreachable: the encoder refused, reset or closed the
	// connection before answering.
	EncoderUnreachable = "unreachable"
	// EncoderTimeout: the fan-out ran past --encoder-timeout.
	EncoderTimeout = "timeout"
	// EncoderStatus: the encoder answered a status other than 2xx.
	EncoderStatus = "status"
	// EncoderBadAnswer: the encoder's answer was not a JSON object (ec-nixl),
	// or too large.
	EncoderBadAnswer = "bad_answer"
	// EncoderDenied: an encoder address refused by the SSRF allowlist
	// (counted per address; the item fails when all are refused).
	EncoderDenied = "ssrf_denied"
	// EncoderInvalid: an x-encoder-hosts-ports entry that is not host:port.
	EncoderInvalid = "invalid_address"
)

// Encoder-leg outcomes (the outcome label of
// pd_sidecar_encode_duration_seconds).
const (
	// EncodeOK: the encoder answered 2xx (and, ec-nixl, a JSON object).
	EncodeOK = "ok"
	// EncodeFailed: the leg failed (see encoder_failures_total).
	EncodeFailed = "failed"
)

// Encoder-stage request outcomes (the outcome label of
// pd_sidecar_encoder_stages_total).
const (
	// StageEncoded: every item was encoded remotely.
	StageEncoded = "encoded"
	// StageDegraded: --on-encoder-failure local sent the request on with
	// some items left for the engine to encode itself.
	StageDegraded = "degraded"
	// StageFailed: the request was answered with the stage's error.
	StageFailed = "failed"
	// StageNoItems: encoders were named but the request has no
	// multimodal item; none was contacted.
	StageNoItems = "no_items"
)

// Encoder holds the encoder stage's collectors.
type Encoder struct {
	// Failures counts failed encoder legs (and refused encoder
	// addresses), by reason.
	Failures *prometheus.CounterVec
	// Duration observes each encoder leg, by outcome.
	Duration *prometheus.HistogramVec
	// Stages counts requests that went through the encoder stage, by
	// outcome.
	Stages *prometheus.CounterVec
	// Items counts multimodal items sent to encoders.
	Items prometheus.Counter
}

// NewEncoder creates the encoder-stage collectors and registers them on reg.
func NewEncoder(reg prometheus.Registerer) *Encoder {
	m := &Encoder{
		Failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_encoder_failures_total",
			Help: "Encoder-stage failures (--ec-connector), by reason: unreachable, timeout, status, bad_answer, ssrf_denied (per refused encoder address), invalid_address.",
		}, []string{"reason"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pd_sidecar_encode_duration_seconds",
			Help:    "Duration of each encoder leg (one multimodal item), by outcome (ok, failed).",
			Buckets: latencyBuckets,
		}, []string{"outcome"}),
		Stages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_encoder_stages_total",
			Help: "Requests naming encoders (x-encoder-hosts-ports with --ec-connector), by outcome: encoded, degraded (--on-encoder-failure local), failed, no_items.",
		}, []string{"outcome"}),
		Items: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pd_sidecar_encoder_items_total",
			Help: "Multimodal items sent to encoders (one encoder leg each).",
		}),
	}
	reg.MustRegister(m.Failures, m.Duration, m.Stages, m.Items)
	for _, r := range []string{EncoderUnreachable, EncoderTimeout, EncoderStatus, EncoderBadAnswer, EncoderDenied, EncoderInvalid} {
		m.Failures.WithLabelValues(r)
	}
	for _, o := range []string{StageEncoded, StageDegraded, StageFailed, StageNoItems} {
		m.Stages.WithLabelValues(o)
	}
	return m
}
