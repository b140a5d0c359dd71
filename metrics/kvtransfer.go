package metrics

import "github.com/prometheus/client_golang/prometheus"

// Failure reasons of a sidecar KV pull (the reason label of
// pd_sidecar_kv_pull_failures_total), a closed set.
const (
	// KVPullSourceGone: the prefiller or its agent was unreachable or broke
	// off mid-pull.
	KVPullSourceGone = "source_gone"
	// KVPullNotHeld: the agent no longer held the blocks (lease expired,
	// already pulled, mismatching ids).
	KVPullNotHeld = "not_held"
	// KVPullChecksum: a block's checksum did not match.
	KVPullChecksum = "checksum"
	// KVPullSize: block sizes or counts disagreed.
	KVPullSize = "size"
	// KVPullDeadline: the pull ran past --kv-pull-timeout.
	KVPullDeadline = "deadline"
	// KVPullAborted: the client left mid-pull.
	KVPullAborted = "aborted"
	// KVPullAlloc: the local engine could not allocate destination blocks.
	KVPullAlloc = "alloc"
	// KVPullOther: anything else (protocol errors, unsupported transport).
	KVPullOther = "other"
)

// KVPull holds the collectors of the sidecar-driven KV pull (the sidecar
// connector) and of kv-probe.
type KVPull struct {
	// Duration observes successful pulls, allocation to verified bytes, per
	// prefiller and transport.
	Duration *prometheus.HistogramVec
	// Bytes counts pulled bytes per prefiller and transport.
	Bytes *prometheus.CounterVec
	// Failures counts failed pulls per prefiller and reason.
	Failures *prometheus.CounterVec
	// ProbeLatency observes the periodic probe's round trip to recently
	// used prefillers' agents.
	ProbeLatency *prometheus.HistogramVec
}

// NewKVPull creates the KV pull collectors and registers them on reg.
func NewKVPull(reg prometheus.Registerer) *KVPull {
	m := &KVPull{
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pd_sidecar_kv_pull_duration_seconds",
			Help:    "Sidecar-driven KV pulls that succeeded: local allocation to verified bytes, by prefiller and transport.",
			Buckets: latencyBuckets,
		}, []string{"prefiller", "transport"}),
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_kv_pull_bytes_total",
			Help: "Bytes of KV pulled by the sidecar into the local engine, by prefiller and transport.",
		}, []string{"prefiller", "transport"}),
		Failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_kv_pull_failures_total",
			Help: "Sidecar-driven KV pulls that failed (nothing handed to the engine), by prefiller and reason.",
		}, []string{"prefiller", "reason"}),
		ProbeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pd_sidecar_kv_probe_latency_seconds",
			Help:    "Round trip of the periodic probe to recently used prefillers' KV agents, by prefiller and transport.",
			Buckets: latencyBuckets,
		}, []string{"prefiller", "transport"}),
	}
	reg.MustRegister(m.Duration, m.Bytes, m.Failures, m.ProbeLatency)
	return m
}

// KVAgent holds the collectors of a kvtransfer agent (prefill side).
type KVAgent struct {
	// HeldBlocks is the number of blocks held for pullers; it returns to 0
	// when nothing is stranded.
	HeldBlocks prometheus.Gauge
	// Releases counts ended holds by reason (completed, released, expired).
	Releases *prometheus.CounterVec
}

// NewKVAgent creates the agent collectors and registers them on reg.
func NewKVAgent(reg prometheus.Registerer) *KVAgent {
	m := &KVAgent{
		HeldBlocks: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvtransfer_agent_held_blocks",
			Help: "KV blocks the kvtransfer agent holds for pullers (stranded KV when it does not return to 0).",
		}),
		Releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvtransfer_agent_releases_total",
			Help: "Holds the kvtransfer agent ended, by reason (completed, released, expired).",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.HeldBlocks, m.Releases)
	return m
}
