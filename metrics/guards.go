package metrics

import "github.com/prometheus/client_golang/prometheus"

// Rejection reasons (the reason label of requests_rejected_total).
const (
	// RejectBodyTooLarge: the request body exceeded --max-request-body-bytes (413).
	RejectBodyTooLarge = "body_too_large"
	// RejectHeadersTooLarge: the request head exceeded --max-header-bytes (431).
	RejectHeadersTooLarge = "headers_too_large"
	// RejectReadTimeout: the request was not read within --read-timeout (408).
	RejectReadTimeout = "read_timeout"
	// RejectMalformed: the request could not be parsed (400).
	RejectMalformed = "malformed"
	// RejectAmbiguousJSON: the request body is well-formed JSON that
	// decoders read differently — a member name given twice in one object,
	// a case variant of a name the sidecar reads, a lone surrogate escape,
	// a stream flag that is not a boolean —
	// so what the sidecar would check is not what the engine would read
	// (400).
	RejectAmbiguousJSON = "ambiguous_json"
	// RejectOverloaded: --max-concurrent-requests were in flight (503).
	RejectOverloaded = "overloaded"
	// RejectSSRF: the prefiller is not on the allowlist (403), named in
	// the header or, with --trust-client-kv-params, in a body's connector
	// fields.
	RejectSSRF = "prefiller_not_allowed"
	// RejectBufferedBytes: the request body, or the local engine's answer
	// read whole, would take the bytes buffered by all connections past
	// --max-buffered-bytes (503).
	RejectBufferedBytes = "buffered_bytes"
	// RejectUnknownRank: x-data-parallel-host-port names no data-parallel
	// rank of this pod (400).
	RejectUnknownRank = "unknown_data_parallel_rank"
	// RejectMethodNotAllowed: the passthrough policy passes no request of
	// this method on this path (405).
	RejectMethodNotAllowed = "method_not_allowed"
	// RejectPathNotAllowed: the passthrough policy passes nothing to this
	// path (403).
	RejectPathNotAllowed = "path_not_allowed"
	// RejectHTTPVersion: the request line names an HTTP version other than
	// 1.0 and 1.1 (505).
	RejectHTTPVersion = "http_version"
	// RejectPathNotNormal: the request target's path is not in normal form
	// (dot or empty segments, percent-encoded bytes) or has a fragment (400).
	RejectPathNotNormal = "path_not_normal"
)

// Circuit probe results (the result label of circuit_probes_total).
const (
	// ProbeUp: the prefiller accepted the probe's connection.
	ProbeUp = "up"
	// ProbeDown: the connection was refused or timed out.
	ProbeDown = "down"
)

// SanitizedFields are the client connector fields removed from request
// bodies (the field label of requests_sanitized_total; the same names as
// connectors.ClientFieldNames).
var SanitizedFields = []string{
	"kv_transfer_params", "ec_transfer_params",
	"bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
	"remote_bootstrap_addr", "transfer_id", "kv_source", "kv_preloaded",
}

// Guards holds the collectors of the request guards: limits, SSRF
// protection and the per-prefiller circuit breaker.
type Guards struct {
	// Rejected counts requests refused before any upstream leg, by reason
	// (buffered_bytes: also a local engine's answer refused by the budget).
	Rejected *prometheus.CounterVec
	// CircuitOpen is the number of prefillers whose circuit is open or
	// half-open now.
	CircuitOpen prometheus.Gauge
	// CircuitProbes counts the connect probes of open circuits, by result
	// (ProbeUp, ProbeDown).
	CircuitProbes *prometheus.CounterVec
	// Sanitized counts requests whose body carried a client connector
	// field, by field (SanitizedFields), removed before any engine saw it.
	Sanitized *prometheus.CounterVec
	// BufferedBytes is the bytes reserved now from --max-buffered-bytes
	// (request bodies, and answers, read whole).
	BufferedBytes prometheus.Gauge
}

// NewGuards creates the guard collectors and registers them on reg.
func NewGuards(reg prometheus.Registerer) *Guards {
	g := &Guards{
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_requests_rejected_total",
			Help: "Requests refused before any upstream leg, by reason (body_too_large, headers_too_large, read_timeout, malformed, overloaded, prefiller_not_allowed, buffered_bytes, unknown_data_parallel_rank, method_not_allowed, path_not_allowed, http_version, path_not_normal).",
		}, []string{"reason"}),
		CircuitOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pd_sidecar_prefiller_circuits_open",
			Help: "Prefillers skipped by the circuit breaker now (open or half-open circuits).",
		}),
		CircuitProbes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_circuit_probes_total",
			Help: "Connect probes of prefillers whose circuit is open (--circuit-probe-interval), by result: up (it accepted the connection; the next request is the half-open trial), down.",
		}, []string{"result"}),
		Sanitized: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_requests_sanitized_total",
			Help: "Requests whose body carried the client's own connector field (kv_transfer_params, ec_transfer_params, bootstrap_host, ...), removed before any engine saw it, by field.",
		}, []string{"field"}),
		BufferedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pd_sidecar_buffered_bytes",
			Help: "Bytes reserved now from --max-buffered-bytes by request bodies and answers read whole.",
		}),
	}
	reg.MustRegister(g.Rejected, g.CircuitOpen, g.CircuitProbes, g.Sanitized, g.BufferedBytes)
	g.CircuitProbes.WithLabelValues(ProbeUp)
	g.CircuitProbes.WithLabelValues(ProbeDown)
	for _, f := range SanitizedFields {
		g.Sanitized.WithLabelValues(f)
	}
	for _, r := range []string{RejectBodyTooLarge, RejectHeadersTooLarge, RejectReadTimeout, RejectMalformed, RejectAmbiguousJSON, RejectOverloaded, RejectSSRF, RejectBufferedBytes, RejectUnknownRank} {
		g.Rejected.WithLabelValues(r)
	}
	return g
}
