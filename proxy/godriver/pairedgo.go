package godriver

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The goroutine driver of a paired split (split.Paired): both legs at once
// on fasthttp's path. The decode leg is relayed on the request's goroutine
// (relay.Forward), the prefill leg runs on a goroutine of its own, and a timer
// may fire on a third: each feeds the machine under mu. What an event
// decides that touches only the legs (cancel the decode, abandon the
// prefill, let a held output through, tell the breaker, count) is done at
// once, under mu, so that a prefill failing as the decode's first output
// comes cannot cancel a decode already past its point of no return; what
// touches the request (a relay, an answer, a fallback) comes only from the
// request's own events and is done on its goroutine, after mu.

// goPaired is one request's paired split on fasthttp's path.
type goPaired struct {
	r   *relay.Exchange
	log zerolog.Logger // the request's, for the prefill leg's goroutine

	mu sync.Mutex
	m  *split.Paired
	s  *core.Paired // its legs and accounting

	parent       context.Context // the request's
	dctx         context.Context // the decode leg's: cancelled by CancelDecode
	cancelDecode context.CancelCauseFunc
	pctx         context.Context         // the prefill leg's
	cancelPre    context.CancelCauseFunc // the prefill leg's
	released     chan struct{}           // closed by ReleaseOutput
	timers       [split.Timers]*time.Timer
}

// newPaired returns the driver of the paired split s of r.
func newPaired(r *relay.Exchange, s *core.Paired) *goPaired {
	return &goPaired{r: r, log: *r.R.Logger(), m: split.NewPaired(s.Config), s: s, parent: r.R.Ctx, released: make(chan struct{})}
}

// run runs the split begun by start: its prefill leg carrying pre and its
// decode leg carrying dec (unless start skips them).
func (d *goPaired) run(start split.PairedStart, pre, dec []byte) {
	r := d.r
	d.mu.Lock()
	// The legs' contexts are made before anything (a timer, the prefill
	// leg) may cancel them. The prefill leg's ends with the leg, which may
	// outlive this goroutine, or with the request.
	d.dctx, d.cancelDecode = context.WithCancelCause(d.parent)
	d.pctx, d.cancelPre = context.WithCancelCause(d.parent)
	acts := d.exec(d.m.Start(start))
	d.mu.Unlock()
	next := d.act(acts, pre, dec)
	if next == nil {
		return
	}
	if r.R.Gone() {
		d.feed(split.Event{Kind: split.ClientGone, Err: context.Cause(d.parent)})
	}
	d.act(d.feed(*next), nil, nil)
}

// feed gives the machine ev under mu, does what touches only the legs at
// once, and returns what is the request's goroutine's to do.
func (d *goPaired) feed(ev split.Event) []split.Action {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.exec(d.m.On(ev))
}

// exec does the actions that touch only the legs (mu held) and returns the
// others, in order.
func (d *goPaired) exec(acts []split.Action) []split.Action {
	var rest []split.Action
	for _, a := range acts {
		switch a.Op {
		case split.CancelDecode:
			d.cancelDecode(a.Err)
		case split.AbandonPrefill:
			d.cancelPre(nil)
		case split.CancelPrefill:
			d.cancelPre(a.Err)
		case split.ReleaseOutput:
			close(d.released)
		case split.Arm:
			t := a.Timer
			if old := d.timers[t]; old != nil {
				old.Stop()
			}
			d.timers[t] = time.AfterFunc(a.After, func() {
				d.feed(split.Event{Kind: split.TimerFired, Timer: t})
			})
		case split.Disarm:
			if t := d.timers[a.Timer]; t != nil {
				t.Stop()
			}
		default:
			if !d.s.Account(a, &d.log) {
				rest = append(rest, a)
			}
		}
	}
	return rest
}

// act does the request's actions on its goroutine: it sends the legs
// (pre, dec), relays, answers. It returns the decode leg's failure as the
// machine's event (nil: none, or the request is answered).
func (d *goPaired) act(acts []split.Action, pre, dec []byte) *split.Event {
	r := d.r
	var next *split.Event
	for _, a := range acts {
		switch a.Op {
		case split.SendPrefill:
			d.sendPrefill(pre)
		case split.SendDecode:
			if err := d.Decode(dec); err != nil {
				next = &split.Event{Kind: split.DecodeEnded, Err: err}
			} else {
				d.feed(split.Event{Kind: split.DecodeEnded})
			}
		case split.SendLocal:
			d.s.DecodeDropped(r.R)
			r.Fail(relay.Decode(r, r.R.Body, false))
		case split.PassOn:
			d.s.DecodeDropped(r.R)
			r.PassOn(a.Err)
		case split.Fail:
			r.Fail(a.Err)
		case split.Degraded:
			r.R.Degraded(a.Reason, a.Err)
		}
	}
	return next
}

// Decode relays the decode leg carrying dec, under a context the machine
// may cancel until its first output, which it is told of (and, for a
// held output, waits for the word to let it through).
func (d *goPaired) Decode(dec []byte) error {
	r := d.r
	d.s.DecodeSent(r.R)
	r.R.Ctx = d.dctx
	r.R.OnOutput = func() {
		d.feed(split.Event{Kind: split.FirstOutput})
		d.mu.Lock()
		holding := d.m.Holding()
		d.mu.Unlock()
		if holding {
			select {
			case <-d.released:
			case <-d.parent.Done():
			}
		}
	}
	err := relay.Forward(r, dec, true)
	r.R.OnOutput = nil
	r.R.Ctx = d.parent
	return err
}

// sendPrefill sends the prefill leg carrying pre on a goroutine of its own,
// until the machine cancels it. The leg's answer is read and discarded.
func (d *goPaired) sendPrefill(pre []byte) {
	r, p := d.r, d.r.R.P
	pctx, cancel := d.pctx, d.cancelPre
	leg := d.s.StartPrefill(r.R) // before the head, which names its span
	req := r.PrefillRequest(pre)
	addr := r.R.Prefiller
	go func() {
		defer cancel(nil)
		resp := fasthttp.AcquireResponse()
		hold, err := p.Tr.Do(pctx, addr, req, resp)
		fasthttp.ReleaseRequest(req)
		if err != nil {
			err = core.PrefillTransportErr(upstream.CtxErr(pctx, err))
		}
		err = leg.End(resp.StatusCode(), resp.Header.ContentType(), resp.Body(), err)
		hold.Release()
		fasthttp.ReleaseResponse(resp)
		if d.parent.Err() != nil {
			d.feed(split.Event{Kind: split.ClientGone, Err: context.Cause(d.parent)})
		}
		if err == nil {
			d.feed(split.Event{Kind: split.PrefillAnswered})
			return
		}
		d.feed(split.Event{Kind: split.PrefillFailed, Err: err})
	}()
}
