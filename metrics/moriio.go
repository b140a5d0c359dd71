package metrics

import "github.com/prometheus/client_golang/prometheus"

// MoriIO holds the collectors of MoRI-IO's request-path DNS re-resolution of
// its host specs (--moriio-local-pod-ip, --moriio-remote-hosts,
// --moriio-decode-hosts), named as llm-d's sidecar names them.
type MoriIO struct {
	// DNSReresolve counts lookups of a host spec on the request path
	// (a cold spec, or a stale one revalidated).
	DNSReresolve prometheus.Counter
	// DNSIPChanged counts re-resolutions that found a different IP.
	DNSIPChanged prometheus.Counter
	// DNSLookupFailures counts lookups that failed or timed out (the stale
	// IP, or the raw spec when there is none, is used).
	DNSLookupFailures prometheus.Counter
}

// NewMoriIO creates the MoRI-IO collectors and registers them on reg.
func NewMoriIO(reg prometheus.Registerer) *MoriIO {
	m := &MoriIO{
		DNSReresolve: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "moriio_dns_reresolve_total",
			Help: "MoRI-IO host-spec DNS lookups on the request path (cold specs and stale ones revalidated).",
		}),
		DNSIPChanged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "moriio_dns_ip_changed_total",
			Help: "MoRI-IO host-spec re-resolutions that found a different IP.",
		}),
		DNSLookupFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "moriio_dns_lookup_failures_total",
			Help: "MoRI-IO host-spec DNS lookups that failed or timed out (the stale IP, else the raw spec, is used).",
		}),
	}
	reg.MustRegister(m.DNSReresolve, m.DNSIPChanged, m.DNSLookupFailures)
	return m
}
