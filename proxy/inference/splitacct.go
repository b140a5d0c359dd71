package inference

import (
	"errors"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// What both drivers of a split share: how a request names its prefiller,
// how a split begins (the hedge point, the breaker's verdict), and the
// accounting actions of split.Sequential (counters, log lines, the
// breaker's ticket), done the same way whichever path serves the request.

// NamePrefiller takes the prefiller that x-prefiller-host-port value hv
// names, checked against the allowlist; an error is the reason to fall
// back (the request names one all the same).
func (r *Request) NamePrefiller(hv []byte) error {
	p := r.P
	r.named = true
	hp, err := p.pickAllowed(hv)
	r.Prefiller, r.Label = hp, p.prefillerLabel(hp, err)
	r.logReady = false // the request's logger gets the prefiller field
	return err
}

// SplitStart is how the request's sequential split begins: its hedge
// point, when it may be hedged, and the prefiller's circuit breaker asked
// for the prefill, unless bodyErr says its body could not be built. tk is
// the breaker's ticket (nil: no prefill is sent, start.NoPrefill says why).
func (r *Request) SplitStart(bodyErr error) (start split.Start, tk *circuit.Ticket) {
	p := r.P
	// Every split refills the hedge budget, hedged or not.
	if after, ok := p.hedge.Split(r.Label); ok && p.hedgeable() {
		start.HedgeAfter, start.TakeHedge = after, p.hedge.Take
	}
	if bodyErr != nil {
		start.NoPrefill = bodyErr
		return start, nil
	}
	tk, err := p.Guard.AllowPrefill(r.Prefiller)
	start.NoPrefill = err
	return start, tk
}

// Account does an accounting action of the split; tk is the breaker's
// ticket the split holds, cleared once its outcome is reported.
func (r *Request) Account(a split.Action, tk **circuit.Ticket) {
	switch a.Op {
	case split.BreakerDone:
		r.P.Guard.BreakerDone(r.Prefiller, *tk, a.Err)
		*tk = nil
	case split.Retrying:
		r.retrying(a.Attempt, a.Err)
	case split.Degraded:
		r.Degraded(a.Reason, a.Err)
	case split.HedgeWon:
		r.hedgeWon(a.Winner, a.After)
	case split.HedgeLocalFailed:
		if !r.Gone() {
			r.LogAt(zerolog.WarnLevel).Err(a.Err).Msg("hedge: local prefill failed; waiting for the prefill")
		}
	}
}

// SplitConfig is the sequential split's configuration.
func (p *Proxy) SplitConfig() split.Config {
	return split.Config{
		PrefillTimeout: p.Cfg.PrefillTimeout,
		MaxRetries:     p.Cfg.PrefillMaxRetries,
		RetryBackoff:   p.Cfg.PrefillRetryBackoff,
		Fallback:       p.Cfg.PrefillFallback,
		DecodeTPSize:   p.Cfg.DecodeTPSize,
		Judge:          SplitJudge,
	}
}

// SplitJudge is what a failure means to a split: the proxy's one
// classifier (classify), and whether it is a prefiller's rejection.
func SplitJudge(err error) split.Verdict {
	o := Classify(err)
	var rej *Rejected
	return split.Verdict{Reason: o.reason, Retry: o.retry, Rejected: errors.As(err, &rej)}
}
