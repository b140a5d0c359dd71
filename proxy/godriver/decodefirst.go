package godriver

import (
	"bytes"
	"errors"
	"io"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The goroutine driver of a decode-first attempt (split.DecodeFirst) on
// fasthttp's path. It runs on the request's goroutine: the decode-first
// leg is sent and read there, up to where the connector's Declined says
// whether the decode engine serves the request, and what that means is
// the machine's. The client is looked at once the answer is ready to be
// relayed, and its leaving told to the machine first.

// goDecodeFirst is one request's decode-first attempt on fasthttp's path.
type goDecodeFirst struct {
	r  *relay.Exchange
	df core.DecodeFirst // the request's side of the attempt
	m  *split.DecodeFirst

	a        *firstAnswer // the decode engine's answer, held (nil: none)
	answered bool         // the request's answer is written, streaming or failed
}

// firstAnswer is the decode engine's answer to the decode-first leg, read
// up to where it says whether it serves the request, and held until it is
// relayed or dropped: nothing of it has reached the client.
type firstAnswer struct {
	leg  *upstream.Leg
	resp *fasthttp.Response
	g    prometheus.Gauge // the local phase's in-flight gauge, held

	er   *sse.Reader // a stream's reader (nil: a JSON answer)
	held []byte      // a stream's events up to its first output

	buf  []byte // a JSON answer's body
	hold upstream.AnswerHold
}

// serveDecodeFirst tries the request on the decode engine first when the
// connector selects it. It reports whether the request was answered; false
// means it was not tried, or was declined, and the sequential handoff runs
// with r.R.Body replaced by the connector's AfterDecline body (so a local
// fallback cannot be declined again).
func serveDecodeFirst(r *relay.Exchange) bool {
	d := &goDecodeFirst{r: r, df: core.BeginDecodeFirst(r.R), m: split.NewDecodeFirst()}
	for next := d.exec(d.m.Start(d.df.Try())); next != nil; {
		next = d.exec(d.on(*next))
	}
	return d.answered
}

// on gives the machine ev. An answer ready to be relayed to a client that
// left is told after its leaving.
func (d *goDecodeFirst) on(ev split.Event) []split.Action {
	if ev.Kind == split.FirstAnswerReady && d.r.LeftNow() {
		acts := d.m.On(split.Event{Kind: split.ClientGone, Err: core.ErrClientGone})
		return append(acts, d.m.On(ev)...)
	}
	return d.m.On(ev)
}

// exec executes acts in order; it returns the event a leg or a body it
// built ended with (nil: none).
func (d *goDecodeFirst) exec(acts []split.Action) *split.Event {
	r := d.r
	var next *split.Event
	for _, a := range acts {
		switch a.Op {
		case split.SendDecodeFirst:
			ev := d.send()
			next = &ev
		case split.DropDecodeFirst:
			if d.a != nil {
				d.a.drop()
				d.a = nil
			}
		case split.RelayDecodeFirst:
			d.answered = true
			d.relay()
		case split.BuildAfterDecline:
			if err := d.df.AfterDecline(); err != nil {
				next = &split.Event{Kind: split.AfterDeclineFailed, Err: err}
				continue
			}
			next = &split.Event{Kind: split.AfterDeclineBuilt}
		case split.RunSplit, split.DecodeFirstCounted:
			d.df.Account(a)
		case split.Fail:
			d.answered = true
			r.Fail(a.Err)
		}
	}
	return next
}

// send sends the client body to the local engine and inspects the answer:
// a JSON answer whole, an SSE answer up to its first output event. The
// answer, declined or not, is held (d.a) until it is relayed or dropped;
// a failed leg is let go.
func (d *goDecodeFirst) send() split.Event {
	r := d.r
	g := r.R.P.M.Inflight.WithLabelValues(metrics.PhaseLocal)
	g.Inc()
	req := r.Upstream(r.R.Local, r.R.Body)
	resp := fasthttp.AcquireResponse()
	leg, err := relay.OpenLeg(r.R.Ctx, r, req, resp)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		g.Dec()
		fasthttp.ReleaseResponse(resp)
		return split.Event{Kind: split.FirstLegFailed, Err: core.BeforeOutputErr(err)}
	}
	a := &firstAnswer{leg: leg, resp: resp, g: g}
	if !bytes.HasPrefix(resp.Header.ContentType(), core.EventStream) {
		a.buf, a.hold, err = leg.ReadAll(r.R.P.Cfg.MaxUpstreamAnswerBytes)
		leg.Close()
		a.leg = nil
		if err != nil {
			a.drop()
			return split.Event{Kind: split.FirstLegFailed, Err: core.DecodeTransportErr(err)}
		}
		d.a = a
		if d.df.AnswerDeclines(resp.StatusCode(), a.buf) {
			return split.Event{Kind: split.FirstAnswerDeclined}
		}
		return split.Event{Kind: split.FirstAnswerReady}
	}
	return d.readSSE(a)
}

// readSSE reads events up to the first that carries output (or is known to
// decline), holding them from the stream's first event on.
func (d *goDecodeFirst) readSSE(a *firstAnswer) split.Event {
	r := d.r
	a.er = r.EventReader(a.leg)
	for {
		ev, err := a.er.Next()
		if errors.Is(err, io.EOF) && len(a.held) > 0 {
			break // a short stream: relay what came
		}
		if err != nil {
			a.drop()
			return split.Event{Kind: split.FirstLegFailed, Err: core.BeforeOutputErr(err)}
		}
		a.held = append(a.held, ev...)
		data := sse.FirstData(ev)
		if data != nil && d.df.EventDeclines(data) {
			d.a = a
			return split.Event{Kind: split.FirstAnswerDeclined}
		}
		if (data == nil || connectors.ClassifyEvent(r.R.API, data) == connectors.EventPreamble) && len(a.held) < core.MaxHeld {
			continue
		}
		break
	}
	d.a = a
	return split.Event{Kind: split.FirstAnswerReady}
}

// drop lets go of an answer the client never saw: its connection is
// closed, so the engine aborts the request.
func (a *firstAnswer) drop() {
	if a.er != nil {
		a.er.Release()
	}
	if a.leg != nil {
		a.leg.Close()
	}
	a.hold.Release()
	fasthttp.ReleaseResponse(a.resp)
	a.g.Dec()
}

// relay relays the held answer as the decode engine's: a JSON answer
// whole, a stream from its held events on.
func (d *goDecodeFirst) relay() {
	r, a := d.r, d.a
	d.a = nil
	if a.er == nil {
		defer a.drop() // buf is let go on return (rc keeps a copy)
		r.CopyHead(a.resp)
		r.RC.SetBody(r.R.LocalAnswerBody(a.resp.StatusCode(), a.buf))
		d.df.Answered(a.resp.StatusCode(), false)
		return
	}
	a.leg.Began()
	r.CopyHead(a.resp)
	d.df.Answered(a.resp.StatusCode(), true)
	relay.StreamBody(r, relay.NewSSEBody(r, a.er, a.leg, a.held, false, func() {
		a.er.Release()
		a.leg.Close()
		fasthttp.ReleaseResponse(a.resp)
		a.g.Dec()
		r.Finish()
	}))
}
