package core

import (
	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/prewarm"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// newPrewarmer returns the warm-ups of p's new prefillers
// (--prefill-prewarm): its split, through its transport, to each of its
// local engines, with its checks of a handoff.
func newPrewarmer(p *Sidecar) *prewarm.Warmer {
	locals := make([]string, p.Cfg.DataParallelSize)
	for rank := range locals {
		locals[rank] = p.LocalAddr(rank)
	}
	return prewarm.New(prewarm.Deps{
		Covered:        p.prewarmCovered,
		Own:            p.pod.ownAddr,
		Seq:            p.seq,
		CheckHandoff:   p.handoffAllowed,
		TPGuard:        func(h connectors.Handoff) error { return split.TPGuard(p.Cfg.DecodeTPSize, h) },
		Transport:      p.Tr,
		Locals:         locals,
		PrefillTimeout: p.Cfg.PrefillTimeout,
		ConnectTimeout: p.Cfg.ConnectTimeout,
		Spread:         p.Cfg.PrefillPrewarmSpread,
		Count:          p.M.Prewarms,
		Log:            p.Log,
	})
}

var _ Background = (*prewarm.Warmer)(nil)
