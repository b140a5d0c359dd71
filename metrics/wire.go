package metrics

import "github.com/prometheus/client_golang/prometheus"

// maxUnknownMembers bounds the member label of kv_params_unknown_members_total:
// the names come from upstream answers.
const maxUnknownMembers = 32

// Wire holds the collectors of what the sidecar learns of the engines'
// wire: members a prefill answer carried that the connector's schema does
// not document, addresses it rewrote, and the local engine's version.
type Wire struct {
	// UnknownMembers counts prefill answers' kv_transfer_params members the
	// connector's schema does not document, by connector and member (the
	// names bounded by UnknownMemberNames): passed on to the decode engine
	// unchanged, or, with --kv-params-unknown-members=refuse, refused.
	UnknownMembers *prometheus.CounterVec
	// UnknownMemberNames bounds the member label.
	UnknownMemberNames *Bounded
	// HostsReplaced counts handoffs whose side-channel host was a name
	// other than the prefiller's, replaced by the prefiller's own host, by
	// connector and member.
	HostsReplaced *prometheus.CounterVec
	// EngineInfo is 1 for the local engine's kind and version as it last
	// answered them (vLLM's GET /version, SGLang's server info).
	EngineInfo *prometheus.GaugeVec
}

// NewWire creates the wire collectors and registers them on reg.
func NewWire(reg prometheus.Registerer) *Wire {
	w := &Wire{
		UnknownMembers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_kv_params_unknown_members_total",
			Help: "Members of prefill answers' kv_transfer_params that the connector does not document, by connector and member (at most 32 names, then other): passed on unchanged when they name no address, refused with --kv-params-unknown-members=refuse.",
		}, []string{"connector", "member"}),
		UnknownMemberNames: NewBounded(maxUnknownMembers),
		HostsReplaced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pd_sidecar_kv_params_hosts_replaced_total",
			Help: "Handoffs whose side-channel host was a name (not an IP address) other than the prefiller's own host, replaced by the prefiller's host before the decode engine saw it, by connector and member.",
		}, []string{"connector", "member"}),
		EngineInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pd_sidecar_engine_info",
			Help: "The local engine's kind (vllm, sglang, unknown) and version as it last answered them (1); absent until the engine answered once.",
		}, []string{"engine", "version"}),
	}
	reg.MustRegister(w.UnknownMembers, w.HostsReplaced, w.EngineInfo)
	return w
}
