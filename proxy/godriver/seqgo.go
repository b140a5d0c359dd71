package godriver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The goroutine driver of the sequential split (split.Sequential) on
// fasthttp's path. The request's goroutine owns the machine and the
// request's state: it feeds the machine the events that reach it on
// channels (a prefill attempt's end, a timer, the hedge's local leg, the
// client leaving) and executes the actions the machine returns. A prefill
// attempt and the hedge's local leg run on goroutines of their own, which
// do their exchange and touch nothing of the request but its immutable
// fields; what their answers mean is worked out back on the request's
// goroutine. Cancelling either waits for its goroutine, so nothing of a
// leg outlives the decision to drop it.

// attemptOut is what a prefill attempt's goroutine ends with: the answer
// as received (its body a copy, its budget share in hold), or the
// exchange's failure.
type attemptOut struct {
	status      int
	contentType []byte
	body        []byte
	hold        upstream.AnswerHold
	err         error
}

// goSplit is one request's sequential split on fasthttp's path.
type goSplit struct {
	r *relay.Exchange
	m *split.Sequential

	seq  core.Sequential // the request's side of the split
	body []byte          // the prefill leg's body

	prefillEnd func(error) // PrefillStarted's
	gauge      prometheus.Gauge

	attempt  context.CancelCauseFunc // the attempt in flight (nil: none)
	attempts chan attemptOut
	res      core.PrefillResult // the prefill's answer

	timers [splitTimers]*time.Timer
	fired  chan split.Timer

	hedgeCancel context.CancelCauseFunc // the hedge's local leg (nil: none runs)
	hedges      chan localOutcome
	hedgeOut    *localOutcome // its end, once received

	goneFed  bool // the machine was told the client left
	answered bool // the request's answer is written or streaming
}

// runSequential runs the request's sequential split (its prefiller
// chosen and allowed).
func runSequential(r *relay.Exchange) {
	p := r.R.P
	d := &goSplit{
		r: r, m: split.NewSequential(p.SplitConfig()),
		attempts: make(chan attemptOut, 1),
		fired:    make(chan split.Timer, splitTimers),
		hedges:   make(chan localOutcome, 1),
	}
	d.run()
}

// splitTimers is the number of a split's timers (a slot each).
const splitTimers = int(split.TimerHedge) + 1

func (d *goSplit) run() {
	r := d.r
	d.seq = core.BeginSequential(r.R)
	body, err := d.seq.PrefillBody(nil)
	start, sends := d.seq.Start(err)
	if sends {
		d.body = body
	}
	d.exec(d.m.Start(start))
	gone := r.R.Ctx.Done()
	for !d.answered && !d.m.Done() {
		select {
		case o := <-d.attempts:
			d.attempt = nil
			d.attemptEnded(o)
		case t := <-d.fired:
			d.feed(split.Event{Kind: split.TimerFired, Timer: t})
		case o := <-d.hedges:
			d.hedgeOut = &o
			if o.err != nil {
				d.feed(split.Event{Kind: split.HedgeFailed, Err: o.err})
			} else {
				d.feed(split.Event{Kind: split.HedgeReady})
			}
		case <-gone:
			gone = nil
			d.feed(split.Event{Kind: split.ClientGone, Err: context.Cause(r.R.Ctx)})
		}
	}
	for _, t := range d.timers {
		if t != nil {
			t.Stop()
		}
	}
}

// feed gives the machine ev, and the events its actions lead to. A client
// that left is told first: nothing is decided for a client that is gone.
func (d *goSplit) feed(ev split.Event) {
	if !d.goneFed && ev.Kind != split.ClientGone && d.r.R.Gone() {
		d.goneFed = true
		d.exec(d.m.On(split.Event{Kind: split.ClientGone, Err: context.Cause(d.r.R.Ctx)}))
	}
	if ev.Kind == split.ClientGone {
		if d.goneFed {
			return
		}
		d.goneFed = true
	}
	for next := &ev; next != nil; {
		next = d.exec(d.m.On(*next))
	}
}

// exec executes acts in order; it returns the event a leg that was to
// answer ended with (nil: none).
func (d *goSplit) exec(acts []split.Action) *split.Event {
	r, p := d.r, d.r.R.P
	var next *split.Event
	for _, a := range acts {
		switch a.Op {
		case split.SendPrefill:
			if a.Plain {
				// Its body again, without what the last attempt failed on.
				body, err := d.seq.PrefillBody(nil)
				if err != nil {
					next = &split.Event{Kind: split.PrefillFailed, Err: err}
					continue
				}
				d.body = body
			}
			d.sendPrefill()
		case split.CancelPrefill:
			d.cancelPrefill(a.Err)
		case split.Arm:
			t := a.Timer
			if old := d.timers[t]; old != nil {
				old.Stop()
			}
			d.timers[t] = time.AfterFunc(a.After, func() {
				select {
				case d.fired <- t:
				default: // the machine ignores a fire it no longer waits for
				}
			})
		case split.Disarm:
			if t := d.timers[a.Timer]; t != nil {
				t.Stop()
			}
		case split.SendHedge:
			d.sendHedge()
		case split.DropHedge:
			d.dropHedge()
		case split.RelayHedge:
			o := d.hedgeOut
			d.hedgeOut = nil
			d.answered = true
			commitLocal(r, o.a, d.hedgeCancel)
		case split.SendDecode:
			next = d.Decode(a.Handoff)
		case split.SendLocal:
			d.seq.Local()
			if err := relay.Decode(r, r.R.Body, false); err != nil {
				next = &split.Event{Kind: split.LegFailed, Err: err}
			} else {
				d.answered = true
			}
		case split.AnswerPrefill:
			st, ct, ans, err := d.seq.PrefillAnswer(d.res)
			if err != nil {
				next = &split.Event{Kind: split.LegFailed, Err: err}
				continue
			}
			d.answered = true
			r.Answer(metrics.ModeDisaggregated, st, ct, ans)
		case split.PassOn:
			d.answered = true
			r.PassOn(a.Err)
		case split.Fail:
			d.answered = true
			r.Fail(a.Err)

		case split.PrefillBegan:
			d.gauge = p.M.Inflight.WithLabelValues(metrics.PhasePrefill)
			d.gauge.Inc()
			d.prefillEnd = d.seq.PrefillBegan(time.Now())
		case split.PrefillEnded:
			d.gauge.Dec()
			d.prefillEnd(a.Err)
		default:
			d.seq.Account(a)
		}
	}
	return next
}

// sendPrefill sends an attempt of the prefill leg on a goroutine of its
// own, within the request's context, until the machine cancels it.
func (d *goSplit) sendPrefill() {
	r := d.r
	ctx, cancel := context.WithCancelCause(r.R.Ctx)
	d.attempt = cancel
	req := r.PrefillRequest(d.body)
	go func() {
		defer cancel(nil)
		d.attempts <- prefillExchange(r, ctx, req)
	}()
}

// prefillExchange sends req to the prefiller within ctx and returns its
// answer. It runs beside the request's goroutine: it touches nothing of
// the request but its immutable fields.
func prefillExchange(r *relay.Exchange, ctx context.Context, req *fasthttp.Request) attemptOut {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	hold, err := r.R.P.Tr.Do(ctx, r.R.Prefiller, req, resp)
	if err != nil {
		return attemptOut{err: core.PrefillTransportErr(err)}
	}
	return attemptOut{
		status:      resp.StatusCode(),
		contentType: append([]byte(nil), resp.Header.ContentType()...),
		body:        append([]byte(nil), resp.Body()...),
		hold:        hold,
	}
}

// attemptEnded feeds the machine what an attempt's answer says.
func (d *goSplit) attemptEnded(o attemptOut) {
	res, err := d.attemptAnswer(o)
	if err != nil {
		d.feed(split.Event{Kind: split.PrefillFailed, Err: err})
		return
	}
	d.res = res
	d.feed(split.Event{Kind: split.PrefillAnswered, Handoff: res.Handoff})
}

// attemptAnswer is what an attempt's answer says (PrefillAnswered), its
// copy's budget share kept by the request while the answer is used.
func (d *goSplit) attemptAnswer(o attemptOut) (core.PrefillResult, error) {
	if o.err != nil {
		return core.PrefillResult{}, o.err
	}
	r := d.r
	res, err := d.seq.PrefillAnswered(o.status, o.contentType, o.body)
	var rej *core.Rejected
	if err == nil || errors.As(err, &rej) {
		// The copy of the body is kept (the handoff's, or the rejection
		// passed on) while the request runs: so is its reservation.
		r.R.Keep(&o.hold)
	}
	o.hold.Release()
	return res, err
}

// cancelPrefill abandons the attempt in flight, if any, and waits for its
// goroutine: an answer that came all the same is read (its KV is then
// released as a read never made), and otherwise let go.
func (d *goSplit) cancelPrefill(cause error) {
	if d.attempt == nil {
		return
	}
	d.attempt(cause)
	d.attempt = nil
	o := <-d.attempts
	if _, err := d.attemptAnswer(o); err == nil && errors.Is(cause, split.ErrHedgeLost) {
		d.r.R.LogAt(zerolog.WarnLevel).Msg("hedge: the prefill answered as it was cancelled; its KV is left to the prefiller's lease")
	}
}

// sendHedge sends the client's own body to the local engine on a
// goroutine of its own, its answer held until it is ready (openLocal).
func (d *goSplit) sendHedge() {
	r := d.r
	req := r.Upstream(r.R.Local, r.R.Body)
	ctx, cancel := context.WithCancelCause(r.R.Ctx)
	d.hedgeCancel = cancel
	go func() {
		a, err := openLocal(r, ctx, req)
		d.hedges <- localOutcome{a, err}
	}()
}

// dropHedge abandons the hedge's local leg before anything of it was
// relayed, waiting for its goroutine when it still runs.
func (d *goSplit) dropHedge() {
	if d.hedgeCancel == nil {
		return
	}
	o := d.hedgeOut
	if o == nil {
		d.hedgeCancel(split.ErrHedgeLost)
		got := <-d.hedges
		o = &got
	}
	d.hedgeCancel(nil)
	d.hedgeCancel, d.hedgeOut = nil, nil
	if o.a != nil {
		o.a.discard()
	}
}

// stepHandoff runs, in line, the step a request feature takes the
// handoff h with (the sidecar's own KV pull): the handoff the decode leg
// carries, or the step's failure.
func (d *goSplit) stepHandoff(h connectors.Handoff) (connectors.Handoff, error) {
	var err error
	d.seq.HandoffStep(h, func(hh connectors.Handoff, e error) { h, err = hh, e })(d.r.R.Ctx)()
	return h, err
}

// Decode takes the prefill's handoff to the decode leg: the step a
// request feature takes it with (the sidecar's own KV pull) and MoRI-IO's
// decode fields when they apply, the connector's
// decode body, the leg relayed. A failure before anything reached the
// client is returned as the machine's event.
func (d *goSplit) Decode(h connectors.Handoff) *split.Event {
	r := d.r
	if d.seq.StepsHandoff() {
		var err error
		h, err = d.stepHandoff(h)
		if err != nil {
			return &split.Event{Kind: split.LegFailed, Err: err}
		}
	}
	body, err := d.seq.DecodeBody(nil, h)
	if err != nil {
		return &split.Event{Kind: split.LegFailed, Err: err}
	}
	if err := relay.Decode(r, body, true); err != nil {
		return &split.Event{Kind: split.LegFailed, Err: err}
	}
	d.answered = true
	return nil
}

// heldAnswer is a local leg's answer on fasthttp's path, read up to the
// point where it is ready to be relayed (a stream's first output, a JSON
// answer whole) and held: nothing of it has reached the client. A hedge's
// local leg is read so off the request's goroutine, then relayed
// (commitLocal) or dropped (discard).
type heldAnswer struct {
	leg  *upstream.Leg
	resp *fasthttp.Response
	sent time.Time

	er   *sse.Reader // a stream's reader (nil: a JSON answer)
	held []byte      // a stream's events up to its first output

	buf  []byte // a JSON answer's body
	hold upstream.AnswerHold
}

// openLocal sends req, the client's body to the local engine, and reads its
// answer up to its first output (a stream) or whole (JSON). It uses only
// the request's immutable fields: it runs beside the prefill goroutine.
func openLocal(r *relay.Exchange, ctx context.Context, req *fasthttp.Request) (*heldAnswer, error) {
	resp := fasthttp.AcquireResponse()
	a := &heldAnswer{resp: resp, sent: time.Now()}
	var err error
	a.leg, err = relay.OpenLeg(ctx, r, req, resp)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, core.BeforeOutputErr(err)
	}
	if !bytes.HasPrefix(resp.Header.ContentType(), core.EventStream) || upstream.Bodiless(resp.StatusCode()) {
		a.buf, a.hold, err = a.leg.ReadAll(r.R.P.Cfg.MaxUpstreamAnswerBytes)
		a.leg.Close()
		a.leg = nil
		if err != nil {
			a.discard()
			return nil, core.DecodeTransportErr(err)
		}
		return a, nil
	}
	a.er = r.EventReader(a.leg)
	var errEvent bool
	a.held, errEvent, err = core.ReadToOutput(a.er, r.R.API, nil)
	switch {
	case err != nil:
		a.discard()
		return nil, core.EndedBefore(r.R.Local, "any output", err)
	case errEvent:
		a.discard()
		return nil, fmt.Errorf("%w: the local stream began with an error event", core.ErrDecodeFailed)
	}
	return a, nil
}

// discard drops a held answer the client never saw: its connection is
// closed, so the engine aborts the request.
func (a *heldAnswer) discard() {
	if a.er != nil {
		a.er.Release()
		a.er = nil
	}
	if a.leg != nil {
		a.leg.Close()
		a.leg = nil
	}
	a.hold.Release()
	fasthttp.ReleaseResponse(a.resp)
}

// commitLocal relays a held local answer as the request's answer, as
// relay.Forward does: a stream from its held events on, a JSON answer whole.
// cancel ends the leg's context once the answer is over.
func commitLocal(r *relay.Exchange, a *heldAnswer, cancel context.CancelCauseFunc) {
	g := r.R.P.M.Inflight.WithLabelValues(metrics.PhaseLocal)
	g.Inc()
	r.R.DecodeStarted(false)
	if r.LeftNow() {
		g.Dec()
		cancel(nil)
		a.discard()
		r.LeftBeforeAnswer(core.ErrClientGone)
		return
	}
	if a.er == nil {
		defer g.Dec()
		defer cancel(nil)
		defer a.discard()
		r.CopyHead(a.resp)
		r.RC.SetBody(r.R.LocalAnswerBody(a.resp.StatusCode(), a.buf))
		r.R.JSONAnswered(a.resp.StatusCode())
		return
	}
	a.leg.Began()
	r.CopyHead(a.resp)
	r.R.StreamBegan(a.resp.StatusCode())
	relay.StreamBody(r, relay.NewSSEBody(r, a.er, a.leg, a.held, false, func() {
		a.er.Release()
		a.leg.Close()
		fasthttp.ReleaseResponse(a.resp)
		g.Dec()
		cancel(nil)
		r.Finish()
	}))
}

// localOutcome is what the local leg of a hedged request ends with.
type localOutcome struct {
	a   *heldAnswer
	err error
}
