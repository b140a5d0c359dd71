package inference

import (
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// llm-d's deprecated data-parallel rank selector (dprank): an inference
// request whose x-data-parallel-host-port names one of this pod's ranks
// is decoded by that rank's engine; the prefill leg, if any, is
// unchanged. The header never reaches an engine (upstreamHeader,
// rawhttp.AppendLegStart, passthrough). Both drivers pick the rank before
// anything else reads the request.

// rankPicker is the admitter that picks the data-parallel rank (pickRank).
type rankPicker struct{}

func (rankPicker) admit(r *Request, h *fasthttp.RequestHeader) (feature.Step, error) {
	return nil, pickRank(r, h)
}

// pickRank points r's decode legs at the rank its x-data-parallel-host-port
// names (none: r's own rank). An unknown value is counted and refused
// before any leg.
func pickRank(r *Request, h *fasthttp.RequestHeader) error {
	v := h.Peek(HeaderDataParallel)
	if v == nil {
		return nil
	}
	rank, err := r.P.pod.dpPod().Rank(v)
	if err != nil {
		r.P.M.Guards.Rejected.WithLabelValues(metrics.RejectUnknownRank).Inc()
		return err
	}
	local := r.P.LocalAddr(rank)
	if local != r.Local {
		r.LogAt(zerolog.DebugLevel).Str("engine", local).Msg("x-data-parallel-host-port: decoded by another rank's engine")
	}
	r.Local, r.dpRouted = local, true
	return nil
}
