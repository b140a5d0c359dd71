package inference

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/metrics"
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

// hedgeable reports whether the request's prefill may be hedged: hedging
// is on and the split is the plain sequential one (a MoRI-IO write or the
// sidecar's own KV pull follow the prefill, and the local leg would have
// to undo them).
func (p *Proxy) hedgeable() bool {
	return p.hedge != nil && p.Mori == nil && p.KV == nil
}

// hedgeWon counts a hedge's winner and the time its loser ran, and logs a
// prefill that answered first.
func (r *Request) hedgeWon(winner string, loserRan time.Duration) {
	if winner == split.WinnerLocal {
		r.P.hedge.Won(metrics.HedgeLocal, loserRan)
		return
	}
	r.P.hedge.Won(metrics.HedgeRemote, loserRan)
	r.LogAt(zerolog.InfoLevel).Msg("hedge: the prefill answered first; local prefill cancelled")
}
