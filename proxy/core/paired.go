package core

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// What both drivers of a paired split (split.Paired: the concurrent
// connectors, MoRI-IO's parallel dispatch) share: how its legs are built,
// the prefill leg's bookkeeping and what its answer means, and the
// accounting actions of the machine. A driver only sends and reads.

// Paired is a paired split being set up: the machine's configuration and
// start, the legs' bodies and the breaker's ticket.
type Paired struct {
	Config split.PairedConfig
	Start  split.PairedStart
	// Pre and Dec are the prefill and decode legs' bodies (when
	// Start.NoLegs is nil).
	Pre, Dec []byte
	// Ticket is the breaker's, until its outcome is reported (Account).
	Ticket *circuit.Ticket
	// forget is called before a request degrades from a KV load failure
	// (split.HandoffFailed): the prefiller's cached bootstrap answer is
	// forgotten (it may have restarted with a new id).
	forget func()

	p         *Sidecar
	prefiller string
	cc        connectors.Concurrent
	pairing   connectors.Pairing
	boot      connectors.Bootstrapper // nil: the legs need no bootstrap answer
	host      string                  // the prefiller's host
	// handoff is what the decode leg carries: nothing of its own, the
	// engines pair by themselves.
	handoff connectors.Handoff
}

// BeginPaired begins r's paired split: the breaker is asked for the
// prefiller and, for MoRI-IO's parallel dispatch, the legs are built.
// A concurrent connector's legs are built by Legs, once the prefiller's
// bootstrap answer is in hand when its connector has one (Bootstrap).
func BeginPaired(r *Request) *Paired {
	p := r.P
	s := &Paired{p: p, prefiller: r.Prefiller, forget: func() {}}
	s.Config.Fallback, s.Config.Judge = p.Cfg.PrefillFallback, SplitJudge
	s.Config.PrefillTimeout = p.Cfg.PrefillTimeout
	if m := p.Mori; m != nil && m.Cfg.ParallelDispatch {
		s.Config.KVWait, s.Config.HoldOutput = m.Cfg.WaitTimeout, true
	}
	tk, err := p.Guard.AllowPrefill(r.Prefiller)
	if s.Start.NoLegs = err; err != nil {
		return s
	}
	s.Ticket = tk
	host, portStr, _ := net.SplitHostPort(r.Prefiller)
	s.host = host
	if b := r.uses.PairedLegBuilder(); b != nil && p.Mori != nil && p.Mori.Cfg.ParallelDispatch {
		s.builtLegs(r, b, host) // MoRI-IO's parallel dispatch
		return s
	}
	s.cc = p.Conn.(connectors.Concurrent)
	s.pairing = connectors.Pairing{PrefillHost: host, Room: randomRoom(), TransferID: transferID()}
	if p.Cfg.P2P.Enabled {
		port, _ := strconv.Atoi(portStr)
		s.pairing.KVRequestID, s.pairing.PrefillP2PPort, s.pairing.Source = NewUUID(), p.pod.p2pPort(port), r.uses.KVSource()
	}
	if bs, ok := s.cc.(connectors.Bootstrapper); ok {
		s.boot = bs
		s.forget = func() { p.Boot.Forget(bs.BootstrapAddr(host)) }
	}
	return s
}

// Prepare builds the legs of r's split begun by BeginPaired when that needs
// no blocking call: no bootstrap answer is needed, or the prefiller's is
// cached. Otherwise it returns the step that asks the prefiller's
// bootstrap server, within --prefill-timeout, and builds the legs with its
// answer; the split starts once it has run.
func (s *Paired) Prepare(r *Request) feature.Step {
	if s.boot == nil || s.Start.NoLegs != nil {
		s.Legs(r, connectors.Bootstrap{}, nil)
		return nil
	}
	p, bs, host := s.p, s.boot, s.host
	if b, ok := p.Boot.Cached(bs, host); ok {
		s.Legs(r, b, nil)
		return nil
	}
	return func(ctx context.Context) func() {
		b, err := p.Boot.Get(ctx, p.Tr, bs, host, p.Cfg.PrefillTimeout)
		return func() { s.Legs(r, b, err) }
	}
}

// Legs builds the legs of r's concurrent connector's split begun by
// BeginPaired, with the prefiller's bootstrap answer b (or why there is
// none, berr). It does nothing for a split already decided or built.
func (s *Paired) Legs(r *Request, b connectors.Bootstrap, berr error) {
	if s.Start.NoLegs != nil || s.cc == nil || s.Pre != nil {
		return
	}
	if berr != nil {
		s.Start.NoLegs, s.Start.NoLegsReport = berr, berr
		return
	}
	s.pairing.Bootstrap = b
	pre, dec, err := s.cc.Legs(r.API, r.Body, s.pairing)
	if err != nil {
		s.Start.NoLegs, s.Start.NoLegsReport = err, ErrBadRequest
		return
	}
	s.Pre, s.Dec = pre, dec
	if rk, ok := s.cc.(connectors.PrefillRanker); ok {
		r.prefillRank = rk.PrefillRank(s.pairing)
	}
	r.Mode = metrics.ModeDisaggregated
	r.LogAt(zerolog.DebugLevel).Uint64("bootstrap_room", s.pairing.Room).Str("transfer_id", s.pairing.TransferID).Msg("concurrent prefill and decode legs")
}

// builtLegs takes r's legs from the request feature that builds them
// itself (MoRI-IO's parallel dispatch: the decode leg's kv_transfer_params
// are written up front, and it waits in the decode engine for the prefill
// engine to write the KV).
func (s *Paired) builtLegs(r *Request, b feature.PairedLegBuilder, host string) {
	pre, dec, err := b.PairedLegs(r.Body, host)
	if err != nil {
		s.Start.NoLegs, s.Start.NoLegsReport = fmt.Errorf("%w: %w", ErrBadRequest, err), ErrBadRequest
		return
	}
	s.Pre, s.Dec = pre, dec
	r.Mode = metrics.ModeDisaggregated
}

// PairedPrefillLeg is the bookkeeping of a paired split's prefill leg,
// whose answer is discarded (the KV goes from engine to engine): its
// span, its in-flight gauge and its duration. It reads nothing of the
// request after StartPairedPrefill, so it may end on another goroutine.
type PairedPrefillLeg struct {
	p     *Sidecar
	log   zerolog.Logger
	label string
	span  trace.Span    // nil without a tracer
	trace feature.Trace // the request's, which ends span
	gauge prometheus.Gauge
	start time.Time
}

// DecodeSent records that r's decode leg, sent, carries remote KV.
func (s *Paired) DecodeSent(r *Request) { r.Handoff = &s.handoff }

// DecodeDropped records that r's answer carries no remote KV: a local leg
// answers it, or the prefiller's rejection.
func (s *Paired) DecodeDropped(r *Request) { r.Handoff = nil }

// StartPrefill opens r's prefill leg's span (before the leg's head is
// built, so that its trace context names it) and counts it in flight.
func (s *Paired) StartPrefill(r *Request) *PairedPrefillLeg {
	l := &PairedPrefillLeg{p: r.P, log: *r.Logger(), label: r.Label, trace: r.trace,
		gauge: r.P.M.Inflight.WithLabelValues(metrics.PhasePrefill), start: time.Now()}
	if r.trace != nil {
		l.span = r.trace.StartPrefill(r.Label)
	}
	l.gauge.Inc()
	return l
}

// End ends the leg: its answer (status, contentType, body: read whole,
// with the bounds of an upstream answer) or the exchange's failure err
// (a transport failure, PrefillTransportErr's). It returns what the
// answer means to the split: nil, or why the prefill failed. A
// prefiller's 4xx is a Rejected holding a copy of its body.
func (l *PairedPrefillLeg) End(status int, contentType, body []byte, err error) error {
	l.gauge.Dec()
	d := time.Since(l.start)
	l.p.M.PrefillDuration.WithLabelValues(l.label).Observe(d.Seconds())
	if err == nil {
		err = PairedPrefillAnswer(status, contentType, body)
	}
	if l.span != nil {
		l.trace.EndPrefill(l.span, err)
	}
	if err == nil {
		l.log.Debug().Dur("took_ms", d).Msg("prefill leg answered")
	}
	return err
}

// PairedPrefillAnswer is what a paired split's prefill answer means: nil
// for a 200, else why it failed.
func PairedPrefillAnswer(status int, contentType, body []byte) error {
	switch {
	case status == http.StatusOK:
		return nil
	case status == http.StatusTooManyRequests:
		return ErrPrefillOverloaded
	case status >= 500:
		return fmt.Errorf("%w: status %d", ErrPrefillServerError, status)
	case status < 400:
		return fmt.Errorf("%w: %w: status %d", connectors.ErrBadPrefillAnswer, upstream.ErrBadUpstreamAnswer, status)
	}
	return &Rejected{Status: status, ContentType: string(contentType), Body: append([]byte(nil), body...)}
}

// Account does the split's accounting actions, which touch only the
// legs (the breaker's ticket, the prefill leg's failure, a held output let
// through at the KV-wait bound), and reports whether a was one; log is the
// request's logger (a copy, for a driver that calls this off the
// request's goroutine).
func (s *Paired) Account(a split.Action, log *zerolog.Logger) bool {
	p := s.p
	switch a.Op {
	case split.BreakerDone:
		if errors.Is(a.Err, split.ErrAbandoned) {
			log.Debug().Msg("prefill leg cancelled with the request")
		}
		p.Guard.BreakerDone(s.prefiller, s.Ticket, a.Err)
		s.Ticket = nil
	case split.PrefillLegFailed:
		p.M.PrefillLegFailures.WithLabelValues(a.Reason).Inc()
		if a.Attempt == 1 {
			log.Warn().Err(a.Err).Str("reason", a.Reason).Msg("prefill leg failed after the decode started")
		} else {
			log.Warn().Err(a.Err).Str("reason", a.Reason).Msg("prefill leg failed; cancelling the decode leg")
		}
	case split.OutputAtKVWait:
		log.Warn().Msg("MoRI-IO decode produced output before the prefill leg answered; relayed at the KV-wait timeout")
	case split.HandoffFailed:
		s.forget()
	default:
		return false
	}
	return true
}

// Abandon ends a split whose legs were never sent (its request ended
// while its Prepare step ran): the breaker's ticket, if still held, is
// reported as no verdict on the prefiller.
func (s *Paired) Abandon(log *zerolog.Logger) {
	if s.Ticket != nil {
		s.Account(split.Action{Op: split.BreakerDone, Err: split.ErrAbandoned}, log)
	}
}

// randomRoom returns a random number in [0, 2^63).
func randomRoom() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// transferID returns "xfer-" and a random UUID (version 4).
func transferID() string { return "xfer-" + NewUUID() }
