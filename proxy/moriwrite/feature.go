package moriwrite

import (
	"context"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// Feature is MoRI-IO write mode as a request feature: a split's part
// writes MoRI-IO's fields into its legs.
type Feature struct{ State *State }

// Begin implements feature.Feature: a split's part (none for a request
// that is not split).
func (f Feature) Begin(r feature.Request, _ feature.Head) feature.Use {
	if r.Prefiller == "" || r.Refused {
		return nil
	}
	return &use{s: f.State, id: r.ID, log: r.Log}
}

// use is a split's MoRI-IO legs: their rank and transfer id, the
// x-data-parallel-rank they carry, and the host specs' addresses they
// name, once resolved.
type use struct {
	s     *State
	id    string
	log   feature.Logger
	leg   moriio.Leg
	rank  string // the legs' x-data-parallel-rank ("": none)
	addrs *Addrs
}

// PrepareStep implements feature.Preparer: the resolution of the host
// specs the legs name, when one has no address yet (nil: every spec
// resolves without waiting, and the legs are built on either driver
// without waiting on DNS).
func (u *use) PrepareStep() feature.Step {
	if u.s.Ready() {
		return nil
	}
	s := u.s
	return func(ctx context.Context) func() {
		a := s.Resolve(ctx)
		return func() { u.addrs = a }
	}
}

// resolved are the addresses the legs name: those the step resolved, or,
// when every spec had one already (Ready), resolved now without waiting.
func (u *use) resolved() *Addrs {
	if u.addrs == nil {
		u.addrs = u.s.Resolve(context.Background())
	}
	return u.addrs
}

// begin starts the legs: their rank, picked from the request id, and
// transfer id.
func (u *use) begin() {
	u.leg = moriio.Leg{Rank: moriio.PickRank(u.id, u.s.Cfg.Ports.DPSize), TransferID: moriio.TransferID(u.id)}
	u.setRank(u.leg.Rank)
}

// setRank sets the x-data-parallel-rank of the legs sent from now on
// (none when the data-parallel size is 1).
func (u *use) setRank(rank int) {
	if u.s.Cfg.Ports.DPSize > 1 {
		u.rank = strconv.Itoa(rank)
	}
}

// LegRank implements feature.LegRanker.
func (u *use) LegRank() string { return u.rank }

// EditPrefill implements feature.PrefillEditor: the serial prefill leg's
// body (nixlv2's) gets MoRI-IO's write-mode kv_transfer_params.
func (u *use) EditPrefill(body []byte) ([]byte, error) {
	if u.s.Cfg.ParallelDispatch {
		return body, nil // its legs are PairedLegs'
	}
	u.begin()
	a := u.resolved()
	return moriio.WithParams(body, moriio.PrefillParams(u.s.Cfg.Ports, a.Pod, u.leg, a.Decode))
}

// EditDecodeParams implements feature.DecodeParamsEditor: the serial
// decode leg's kv_transfer_params are the prefill answer's with the rank
// (the one it returned, else the request id's) written back and MoRI-IO's
// fields backfilled.
func (u *use) EditDecodeParams(returned []byte) ([]byte, error) {
	l := u.leg
	l.Rank = moriio.DecodeRank(returned, u.s.Cfg.Ports.DPSize, l.Rank)
	u.setRank(l.Rank)
	return moriio.SerialDecodeParams(returned, u.s.Cfg.Ports, l, u.resolved().Remote)
}

// PairedLegs implements feature.PairedLegBuilder (parallel dispatch): the
// decode leg's kv_transfer_params are written up front, and it waits in
// the decode engine for the prefill engine to write the KV. The
// prefiller's host goes as the header named it: only the configured host
// specs are resolved (and cached), never a name a request brings.
func (u *use) PairedLegs(body []byte, prefillHost string) (pre, dec []byte, err error) {
	if !u.s.Cfg.ParallelDispatch {
		return nil, nil, nil
	}
	u.begin()
	a := u.resolved()
	if pre, err = moriio.ParallelPrefillBody(body, moriio.PrefillParams(u.s.Cfg.Ports, a.Pod, u.leg, a.Decode)); err != nil {
		return nil, nil, err
	}
	if dec, err = moriio.WithParams(body, moriio.ParallelDecodeParams(u.s.Cfg.Ports, prefillHost, u.leg, a.Remote)); err != nil {
		return nil, nil, err
	}
	u.log.LogAt(zerolog.DebugLevel).Int("dp_rank", u.leg.Rank).Str("transfer_id", u.leg.TransferID).Msg("MoRI-IO parallel dispatch")
	return pre, dec, nil
}
