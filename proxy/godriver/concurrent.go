package godriver

import (
	crand "crypto/rand"
	"encoding/binary"
	"net"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// choreograph runs the request under the choreography its connector
// declares, when that is not the plain sequential handoff of ServeInference.
// It reports whether the request was served; false lets the sequential
// handoff run (always for Sequential connectors, and for DecodeFirst ones
// when the request is not tried on the decode engine first or was declined).
func choreograph(r *inference.Request) bool {
	if m := r.P.Mori; m != nil && m.Cfg.ParallelDispatch {
		serveMoriParallel(r) // MoRI-IO parallel dispatch
		return true
	}
	switch r.P.Choreo {
	case connectors.ChoreographyConcurrent:
		serveConcurrent(r, r.P.Conn.(connectors.Concurrent))
		return true
	case connectors.ChoreographyDecodeFirst:
		return serveDecodeFirst(r, r.P.Conn.(connectors.DecodeFirst))
	}
	return false
}

// serveConcurrent runs both legs at once (SGLang, Mooncake, the
// offloading connector): the prefill leg in the background, the decode leg
// relayed to the client, as split.Paired decides. The prefiller's circuit
// breaker is asked first, as on the sequential path; its bootstrap server
// (Mooncake's) is asked next; a failure of either, or legs that cannot be
// built, decides the request before any leg is sent.
func serveConcurrent(r *inference.Request, cc connectors.Concurrent) {
	p := r.P
	d := newPaired(r, split.PairedConfig{})
	var start split.PairedStart
	var pre, dec []byte
	host, portStr, _ := net.SplitHostPort(r.Prefiller)
	forget := func() {}
	tk, err := p.Guard.AllowPrefill(r.Prefiller)
	start.NoLegs = err
	if err == nil {
		d.tk = tk
		pr := connectors.Pairing{PrefillHost: host, Room: randomRoom(), TransferID: transferID()}
		if p.Cfg.P2P.Enabled {
			port, _ := strconv.Atoi(portStr)
			pr.KVRequestID, pr.PrefillP2PPort, pr.Source = inference.NewUUID(), p.P2PPort(port), r.KVSourcePeer()
		}
		if bs, ok := cc.(connectors.Bootstrapper); ok {
			forget = func() { p.Boot.Forget(bs.BootstrapAddr(host)) }
			b, err := p.Boot.Get(r.Ctx, p.Tr, bs, host, p.Cfg.PrefillTimeout)
			pr.Bootstrap = b
			if err != nil {
				start.NoLegs, start.NoLegsReport = err, err
			}
		}
		if start.NoLegs == nil {
			if pre, dec, err = cc.Legs(r.API, r.Body, pr); err != nil {
				start.NoLegs, start.NoLegsReport = err, inference.ErrBadRequest
			} else {
				r.Mode = metrics.ModeDisaggregated
				r.LogAt(zerolog.DebugLevel).Uint64("bootstrap_room", pr.Room).Str("transfer_id", pr.TransferID).Msg("concurrent prefill and decode legs")
			}
		}
	}
	d.run(start, pre, dec, forget)
}

// randomRoom returns a random number in [0, 2^63).
func randomRoom() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// transferID returns "xfer-" and a random UUID (version 4).
func transferID() string { return "xfer-" + inference.NewUUID() }
