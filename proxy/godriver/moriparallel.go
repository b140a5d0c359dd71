package godriver

import (
	"fmt"
	"net"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// serveMoriParallel runs MoRI-IO's parallel dispatch: both legs at once,
// the decode leg (its kv_transfer_params written up front) waiting in the
// decode engine for the prefill engine to write the KV. The decode leg's
// output is held until the prefill leg answered. Better than llm-d: a
// prefill leg that fails before the decode produced output degrades to a
// local prefill (llm-d answers the prefill's error), and no prefill outcome
// within --moriio-parallel-decode-wait-timeout is a counted fallback
// (kv_wait_timeout), not a bare 504.
func serveMoriParallel(r *inference.Request) {
	s := r.P.Mori
	d := newPaired(r, split.PairedConfig{KVWait: s.Cfg.WaitTimeout, HoldOutput: true})
	var start split.PairedStart
	var pre, dec []byte
	tk, err := r.P.Guard.AllowPrefill(r.Prefiller)
	start.NoLegs = err
	if err == nil {
		d.tk = tk
		// The prefiller's host goes as the header named it: only the
		// configured host specs are resolved (and cached), never a name a
		// request brings.
		host, _, _ := net.SplitHostPort(r.Prefiller)
		l := inference.MoriLeg(r)
		pre, err = moriio.ParallelPrefillBody(r.Body,
			moriio.PrefillParams(s.Cfg.Ports, s.Dns.Resolve(r.Ctx, s.Cfg.PodIP), l, s.Hosts(r.Ctx, s.Cfg.DecodeHosts)))
		if err == nil {
			dec, err = moriio.WithParams(r.Body,
				moriio.ParallelDecodeParams(s.Cfg.Ports, host, l, s.Hosts(r.Ctx, s.Cfg.RemoteHosts)))
		}
		if err != nil {
			start.NoLegs, start.NoLegsReport = fmt.Errorf("%w: %w", inference.ErrBadRequest, err), inference.ErrBadRequest
		} else {
			r.Mode = metrics.ModeDisaggregated
			r.LogAt(zerolog.DebugLevel).Int("dp_rank", l.Rank).Str("transfer_id", l.TransferID).Msg("MoRI-IO parallel dispatch")
		}
	}
	d.run(start, pre, dec, nil)
}
