package chunked

import (
	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// Feature is chunked decode as a request feature (--decode-chunk-size):
// it chooses the decode strategy of the requests it applies to, as in
// llm-d: /v1/chat/completions requests decoded here (decoder-only, with
// or without a KV cache source; a local-prefill fallback; the decode leg
// of a split when Remote, whose first chunk alone carries the handoff),
// not requests routed by x-data-parallel-host-port, and only a body
// PlanFor cuts.
type Feature struct {
	// Size is the tokens per chunk.
	Size int
	// Remote: a split's decode leg is chunked too (the connector's
	// handoff may go on the first chunk alone: nixlv2's).
	Remote bool
}

// Begin implements feature.Feature.
func (f Feature) Begin(r feature.Request, _ feature.Head) feature.Use {
	if f.Size <= 0 || r.API != connectors.APIChat || r.Routed {
		return nil
	}
	return planner(f)
}

// Planner is a request's part of chunked decode: how the decode of a
// body is cut, if it is.
type Planner interface {
	ChunkPlan(body []byte, remote bool) (Plan, bool)
}

type planner Feature

// ChunkPlan reports whether the decode of body on the local engine
// (remote: a split's decode leg, on the prefill's KV) is chunked, and how.
func (p planner) ChunkPlan(body []byte, remote bool) (Plan, bool) {
	if remote && !p.Remote {
		return Plan{}, false
	}
	return PlanFor(body, p.Size)
}
