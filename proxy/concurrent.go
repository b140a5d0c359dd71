package proxy

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// choreograph runs the request under the choreography its connector
// declares, when that is not the plain sequential handoff of serveInference.
// It reports whether the request was served; false lets the sequential
// handoff run (always for Sequential connectors, and for DecodeFirst ones
// when the request is not tried on the decode engine first or was declined).
func (r *request) choreograph() bool {
	if m := r.p.mori; m != nil && m.cfg.ParallelDispatch {
		r.serveMoriParallel() // MoRI-IO parallel dispatch (moriio.go)
		return true
	}
	switch r.p.choreo {
	case connectors.ChoreographyConcurrent:
		r.serveConcurrent(r.p.conn.(connectors.Concurrent))
		return true
	case connectors.ChoreographyDecodeFirst:
		return r.serveDecodeFirst(r.p.conn.(connectors.DecodeFirst))
	}
	return false
}

// serveConcurrent runs both legs at once (SGLang, Mooncake): the prefill leg
// in the background, the decode leg relayed to the client. A prefill leg that
// fails before the decode produced output cancels the decode leg and the
// request degrades to local prefill (or, for a prefill 4xx, gets that answer);
// one that fails later is counted and logged. A decode leg that fails
// cancels the prefill leg. A client that leaves cancels both.
func (r *request) serveConcurrent(cc connectors.Concurrent) {
	p := r.p
	// The prefiller's circuit breaker, as on the sequential path: an open
	// circuit goes straight to local prefill; the prefill leg's outcome
	// (or the bootstrap query's failure) is reported to it.
	tk, err := r.allowPrefill()
	if err != nil {
		r.fallback(err)
		return
	}
	report := func(err error) { r.breakerDone(tk, err) }
	host, portStr, _ := net.SplitHostPort(r.prefiller)
	pr := connectors.Pairing{PrefillHost: host, Room: randomRoom(), TransferID: transferID()}
	if p.cfg.P2P.Enabled {
		port, _ := strconv.Atoi(portStr)
		pr.KVRequestID, pr.PrefillP2PPort, pr.Source = newUUID(), p.p2pPort(port), r.kvSourcePeer()
	}
	if bs, ok := cc.(connectors.Bootstrapper); ok {
		b, err := p.boot.get(r.ctx, p.tr, bs, host, p.cfg.PrefillTimeout)
		if err != nil {
			report(err)
			r.fallback(err)
			return
		}
		pr.Bootstrap = b
	}
	pre, dec, err := cc.Legs(r.api, r.body, pr)
	if err != nil {
		report(ErrBadRequest)
		r.fail(err)
		return
	}
	r.mode = metrics.ModeDisaggregated
	r.logAt(zerolog.DebugLevel).Uint64("bootstrap_room", pr.Room).Str("transfer_id", pr.TransferID).Msg("concurrent prefill and decode legs")

	pl := r.startPrefillLeg(pre, report)
	r.onOutput = pl.leg.commit
	err = r.forward(dec, true)
	r.endPairedLegs(pl, err, func() {
		if bs, ok := cc.(connectors.Bootstrapper); ok {
			p.boot.forget(bs.BootstrapAddr(host))
		}
	})
}

// pairedLegs is a concurrent split in flight: the prefill leg running in
// the background, and the context the decode leg runs under, which the
// prefill leg cancels when it fails first.
type pairedLegs struct {
	leg           *prefillLeg
	parent, dctx  context.Context
	cancelDecode  context.CancelCauseFunc
	cancelPrefill context.CancelFunc
}

// startPrefillLeg sends the prefill leg carrying pre in the background,
// bounded by --prefill-timeout, its outcome told to report, and points r
// at the decode leg's context (r.ctx = dctx) with an empty handoff (the
// decode leg carries remote KV). endPairedLegs undoes it.
func (r *request) startPrefillLeg(pre []byte, report func(error)) *pairedLegs {
	p := r.p
	pl := &pairedLegs{parent: r.ctx}
	pl.dctx, pl.cancelDecode = context.WithCancelCause(pl.parent)
	pctx, cancelPrefill := context.WithTimeoutCause(pl.parent, p.cfg.PrefillTimeout, ErrPrefillTimeout)
	pl.cancelPrefill = cancelPrefill
	// The prefill span is opened here, so the leg's traceparent names it, and
	// ended by the leg (spans are safe to end from another goroutine).
	sctx, span := r.child(SpanPrefill, trace.SpanKindClient)
	if span != nil {
		span.SetAttributes(AttrPrefiller.String(r.label))
		r.obs.leg = sctx
	}
	pl.leg = &prefillLeg{
		p: p, log: *r.logger(), label: r.label, addr: r.prefiller, parent: pl.parent,
		cancelDecode: pl.cancelDecode, report: report, span: span,
	}
	go pl.leg.run(pctx, cancelPrefill, r.prefillRequest(pre))
	r.handoff = &connectors.Handoff{}
	r.ctx = pl.dctx
	return pl
}

// endPairedLegs ends a concurrent split whose decode leg returned err: on
// success nothing more; when the prefill leg failed first (and cancelled
// the decode), the prefill's failure decides; else the prefill leg is
// cancelled and a KV load failure (after kvLoadFailed, which may forget
// what led to it) degrades to a local prefill, any other error is
// answered.
func (r *request) endPairedLegs(pl *pairedLegs, err error, kvLoadFailed func()) {
	r.onOutput = nil
	r.ctx = pl.parent
	pl.leg.commit()
	if err == nil {
		return
	}
	if cause := context.Cause(pl.dctx); pl.parent.Err() == nil && pl.dctx.Err() != nil {
		// The prefill leg failed first and cancelled the decode leg.
		r.handoff = nil
		r.prefillFailed(cause)
		return
	}
	pl.leg.abandon()
	pl.cancelPrefill()
	if errors.Is(err, ErrKVLoadFailed) {
		r.handoff = nil
		if kvLoadFailed != nil {
			kvLoadFailed()
		}
		r.fallback(err)
		return
	}
	r.fail(err)
}

// prefillLeg is the background prefill leg of a concurrent split. It reads
// nothing of the request but what it was given, so it may outlive the
// handler.
type prefillLeg struct {
	p            *Proxy
	log          zerolog.Logger
	label, addr  string
	parent       context.Context
	cancelDecode context.CancelCauseFunc
	report       func(error) // tells the prefiller's circuit breaker
	span         trace.Span  // the prefill span (nil without a tracer)

	mu        sync.Mutex
	committed bool        // the decode produced output: never cancel it now
	abandoned atomic.Bool // the proxy cancelled this leg on purpose
}

// commit marks the decode leg as past the point of no return.
func (l *prefillLeg) commit() {
	l.mu.Lock()
	l.committed = true
	l.mu.Unlock()
}

// abandon marks the leg as cancelled by the proxy (the decode failed).
func (l *prefillLeg) abandon() { l.abandoned.Store(true) }

// run sends the prefill leg and waits for its answer, which is discarded
// (the KV goes from engine to engine); a failure is counted and reported.
func (l *prefillLeg) run(ctx context.Context, cancel context.CancelFunc, req *fasthttp.Request) {
	defer cancel()
	g := l.p.m.Inflight.WithLabelValues(metrics.PhasePrefill)
	g.Inc()
	defer g.Dec()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	start := time.Now()
	hold, err := l.p.tr.Do(ctx, l.addr, req, resp)
	defer hold.Release() // resp is let go when run returns
	fasthttp.ReleaseRequest(req)
	l.p.m.PrefillDuration.WithLabelValues(l.label).Observe(time.Since(start).Seconds())
	if err != nil {
		err = prefillTransportErr(upstream.CtxErr(ctx, err))
	} else {
		switch st := resp.StatusCode(); {
		case st == fasthttp.StatusTooManyRequests:
			err = ErrPrefillOverloaded
		case st >= 500:
			err = fmt.Errorf("%w: status %d", ErrPrefillServerError, st)
		case st != fasthttp.StatusOK && st < 400:
			err = fmt.Errorf("%w: %w: status %d", connectors.ErrBadPrefillAnswer, upstream.ErrBadUpstreamAnswer, st)
		case st != fasthttp.StatusOK:
			err = &rejected{status: st, contentType: string(resp.Header.ContentType()),
				body: append([]byte(nil), resp.Body()...)}
		}
	}
	l.endSpan(err)
	if err == nil {
		l.report(nil)
		l.log.Debug().Dur("took_ms", time.Since(start)).Msg("prefill leg answered")
		return
	}
	if l.parent.Err() != nil || l.abandoned.Load() {
		l.report(ErrClientGone) // says nothing about the prefiller
		l.log.Debug().Err(err).Msg("prefill leg cancelled with the request")
		return
	}
	l.report(err)
	reason := classify(err).reason
	if reason == "" {
		reason = "rejected"
	}
	l.p.m.PrefillLegFailures.WithLabelValues(reason).Inc()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.committed {
		l.log.Warn().Err(err).Str("reason", reason).Msg("prefill leg failed after the decode started")
		return
	}
	l.log.Warn().Err(err).Str("reason", reason).Msg("prefill leg failed; cancelling the decode leg")
	l.cancelDecode(err)
}

// endSpan ends the prefill span with the leg's outcome.
func (l *prefillLeg) endSpan(err error) {
	if l.span == nil {
		return
	}
	if err != nil {
		l.span.RecordError(err)
		l.span.SetStatus(codes.Error, err.Error())
		if rs := classify(err).reason; rs != "" {
			l.span.SetAttributes(AttrReason.String(rs))
		}
	}
	l.span.End()
}

// randomRoom returns a random number in [0, 2^63).
func randomRoom() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// transferID returns "xfer-" and a random UUID (version 4).
func transferID() string { return "xfer-" + newUUID() }

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
