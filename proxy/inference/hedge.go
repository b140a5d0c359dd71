package inference

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// ReasonSlowPrefill: the prefill had not answered by the hedge point and
// the local prefill raced against it was ready first.
const ReasonSlowPrefill = split.ReasonSlowPrefill

// errHedgeLost is the cause a losing leg is cancelled with.
var errHedgeLost = split.ErrHedgeLost
