package proxy

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// heldAnswer is a local leg's answer on fasthttp's path, read up to the
// point where it is ready to be relayed (a stream's first output, a JSON
// answer whole) and held: nothing of it has reached the client. A hedge's
// local leg is read so off the request's goroutine, then relayed
// (commitLocal) or dropped (discard).
type heldAnswer struct {
	leg  *upstream.Leg
	resp *fasthttp.Response
	sent time.Time

	er   *eventReader // a stream's reader (nil: a JSON answer)
	held []byte       // a stream's events up to its first output

	buf  []byte // a JSON answer's body
	hold upstream.AnswerHold
}

// releaseRequest gives back a leg request that was built and never sent.
func releaseRequest(req *fasthttp.Request) { fasthttp.ReleaseRequest(req) }

// openLocal sends req, the client's body to the local engine, and reads its
// answer up to its first output (a stream) or whole (JSON). It uses only
// the request's immutable fields: it runs beside the prefill goroutine.
func (r *request) openLocal(ctx context.Context, req *fasthttp.Request) (*heldAnswer, error) {
	resp := fasthttp.AcquireResponse()
	a := &heldAnswer{resp: resp, sent: time.Now()}
	var err error
	if r.stream && r.p.cfg.DecodeFirstByteTimeout > 0 {
		a.leg, err = r.p.tr.StreamFirstByteTimeout(ctx, r.local, req, resp, r.p.cfg.DecodeFirstByteTimeout)
	} else {
		a.leg, err = r.p.tr.Stream(ctx, r.local, req, resp)
	}
	fasthttp.ReleaseRequest(req)
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, beforeOutputErr(err)
	}
	if !bytes.HasPrefix(resp.Header.ContentType(), eventStream) || upstream.Bodiless(resp.StatusCode()) {
		a.buf, a.hold, err = a.leg.ReadAll(r.p.cfg.MaxUpstreamAnswerBytes)
		a.leg.Close()
		a.leg = nil
		if err != nil {
			a.discard()
			return nil, decodeTransportErr(err)
		}
		return a, nil
	}
	a.er = r.eventReader(a.leg)
	var errEvent bool
	a.held, errEvent, err = readToOutput(a.er, r.api, nil)
	switch {
	case err != nil:
		a.discard()
		return nil, beforeOutputErr(endedEarly(r.local, "any output", err))
	case errEvent:
		a.discard()
		return nil, fmt.Errorf("%w: the local stream began with an error event", ErrDecodeFailed)
	}
	return a, nil
}

// readToOutput reads a stream's events, appended to held, up to its first
// output or error event (error reports the latter), or maxHeld bytes of
// preamble.
func readToOutput(er *eventReader, api connectors.API, held []byte) ([]byte, bool, error) {
	for {
		ev, err := er.next()
		if err != nil {
			return held, false, err
		}
		held = append(held, ev...)
		kind := connectors.EventPreamble
		if d := firstData(ev); d != nil {
			kind = connectors.ClassifyEvent(api, d)
		}
		if kind == connectors.EventPreamble && len(held) < maxHeld {
			continue
		}
		return held, kind == connectors.EventError, nil
	}
}

// discard drops a held answer the client never saw: its connection is
// closed, so the engine aborts the request.
func (a *heldAnswer) discard() {
	if a.er != nil {
		a.er.release()
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
// forward does: a stream from its held events on, a JSON answer whole.
// cancel ends the leg's context once the answer is over.
func (r *request) commitLocal(a *heldAnswer, cancel context.CancelCauseFunc) {
	g := r.p.m.Inflight.WithLabelValues(metrics.PhaseLocal)
	g.Inc()
	r.decodeStarted(false)
	if r.leftNow() {
		g.Dec()
		cancel(nil)
		a.discard()
		r.leftBeforeAnswer(ErrClientGone)
		return
	}
	if a.er == nil {
		defer g.Dec()
		defer cancel(nil)
		defer a.discard()
		r.copyHead(a.resp)
		r.rc.SetBody(a.buf)
		r.jsonAnswered(a.resp.StatusCode())
		return
	}
	a.leg.Began()
	r.copyHead(a.resp)
	r.p.m.Requests.WithLabelValues(r.mode, statusLabel(a.resp.StatusCode())).Inc()
	r.obs.status = a.resp.StatusCode()
	r.streamBody(r.newSSEBody(a.er, a.leg, a.held, false, func() {
		a.er.release()
		a.leg.Close()
		fasthttp.ReleaseResponse(a.resp)
		g.Dec()
		cancel(nil)
		r.finish()
	}))
}
