package inference

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/hedge"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// HedgeConfig is hedged prefill's configuration (hedge.Config); the zero
// value is off.
type HedgeConfig = hedge.Config

// HedgeAutoFloor is the lowest hedge point --prefill-hedge-after auto sets
// (hedge.AutoFloor).
const HedgeAutoFloor = hedge.AutoFloor

// ReasonSlowPrefill: the prefill had not answered by the hedge point and
// the local prefill raced against it was ready first.
const ReasonSlowPrefill = split.ReasonSlowPrefill

// errHedgeLost is the cause a losing leg is cancelled with.
var errHedgeLost = split.ErrHedgeLost
