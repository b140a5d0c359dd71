package inference

import (
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/dprank"
)

// llm-d's deprecated data-parallel rank selector (dprank): an inference
// request whose x-data-parallel-host-port names one of this pod's ranks
// is decoded by that rank's engine; the prefill leg, if any, is
// unchanged. The header never reaches an engine (upstreamHeader,
// rawhttp.AppendLegStart, passthrough), and the lane leaves a request carrying it
// to fasthttp (rawhttp.ScanRequest).

// dpPod is this pod's data-parallel ranks.
func (p *Proxy) dpPod() dprank.Pod {
	return dprank.Pod{Port: p.Cfg.Port, Size: p.Cfg.DataParallelSize, PodIP: p.Cfg.PodIP, Host: p.Cfg.Host}
}

// ownHost reports whether host names this pod (dprank.Pod.OwnHost).
func (p *Proxy) ownHost(host string) bool { return p.dpPod().OwnHost(host) }

// pickRank points r's decode legs at the rank its x-data-parallel-host-port
// names (none: r's own rank). An unknown value is counted and refused
// before any leg.
func (r *Request) pickRank(h *fasthttp.RequestHeader) error {
	v := h.Peek(HeaderDataParallel)
	if v == nil {
		return nil
	}
	rank, err := r.P.dpPod().Rank(v)
	if err != nil {
		r.P.M.Guards.Rejected.WithLabelValues(metrics.RejectUnknownRank).Inc()
		return err
	}
	local := r.P.LocalAddr(rank)
	if local != r.Local {
		r.LogAt(zerolog.DebugLevel).Str("engine", local).Msg("x-data-parallel-host-port: decoded by another rank's engine")
	}
	r.Local = local
	return nil
}
