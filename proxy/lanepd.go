package proxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The lane's P/D split: serveInference's sequential handoff as a state
// machine on the loop. The prefill leg goes out on a pooled connection to
// the prefiller and its answer is read whole; the decode leg carrying the
// KV goes to the local engine, and its answer is held back until its first
// output (loopStream.gate), so that a KV load failure is recovered before
// the client saw anything. Every step and failure is the fasthttp path's,
// with its accounting: the prefiller's circuit breaker, retries with
// backoff within --prefill-timeout, a prefill 4xx passed on, degradation to
// a local prefill (fallback), first-token EOS answered from the prefill,
// the TP guard, the cached_tokens rewrite. Only the sequential choreography
// is served here; the sidecar's own KV pull and TLS to prefillers are the
// fasthttp path's.

// laneSplits reports whether the lane serves P/D requests.
func (p *Proxy) laneSplits() bool {
	return p.seq != nil && p.choreo == connectors.ChoreographySequential && p.kv == nil && !p.cfg.Guard.TLS.Prefiller &&
		p.mori == nil // MoRI-IO's legs are fasthttp's (moriio.go)
}

// lanePD is a split's state on the lane.
type lanePD struct {
	bufp  *[]byte
	buf   []byte // start, then the client's body
	start []byte // the legs' shared head start (appendLegStart)

	tk       *circuit.Ticket // the prefiller's breaker, while the prefill runs
	done     func(error)     // records the prefill's end (prefillStarted)
	timeout  *time.Timer     // --prefill-timeout
	attempts int
	last     error     // the last attempt's failure
	sent     time.Time // the decode leg's start, for the KV handoff's duration

	// hedged prefill (lanehedge.go)
	hedgeAfter time.Duration
	hedgeTimer *time.Timer // the hedge point
	hedge      *laneConn   // the local leg's shadow, while it runs
	hedgeAt    time.Time   // when it started
	awaitHedge bool        // the prefill failed: the hedge is the fallback
}

// split begins the P/D split of the request, its prefiller named by hv.
func (lc *laneConn) split(hv []byte) {
	ll, r, p := lc.ll, lc.r, lc.ll.ln.p
	pd := &lanePD{}
	pd.bufp, pd.buf = p.bufs.getChunk()
	pd.buf = appendLegStart(pd.buf, &ll.req)
	n := len(pd.buf)
	if lc.reqBody == nil { // the body is in the loop's buffer, which the next read overwrites: copied
		pd.bufp, pd.buf = p.bufs.growChunk(pd.bufp, pd.buf, len(r.body))
		pd.buf = append(pd.buf, r.body...)
		r.body = pd.buf[n:]
	}
	pd.start = pd.buf[:n:n]
	lc.pd = pd
	r.named = true
	hp, err := p.pickAllowed(hv)
	r.prefiller, r.label = hp, p.prefillerLabel(hp, err)
	r.logReady = false // the request's logger gets the prefiller field
	if err != nil {
		lc.fallback(err)
		return
	}
	if r.declineShort() { // shortprompt.go
		lc.decodeLeg(r.body, nil, false)
		return
	}
	g := p.guard
	tk, ok := g.breakers.Allow(hp)
	if !ok {
		lc.fallback(fmt.Errorf("%w: %s skipped for up to %v", ErrCircuitOpen, logValue(hp), g.cfg.Breaker.Cooldown))
		return
	}
	scratch, dst := p.bufs.editScratch(len(r.body))
	body, err := p.seq.PrefillBody(dst, r.api, r.body)
	if err != nil {
		p.bufs.putScratch(scratch)
		err = fmt.Errorf("%w: %w", ErrBadRequest, err)
		tk.Done(breakerResult(err))
		g.trackCircuit(hp)
		lc.fallback(err)
		return
	}
	r.mode = metrics.ModeDisaggregated
	pd.tk = tk
	lc.setGauge(ll.prefill)
	pd.done = r.prefillStarted(time.Now())
	pd.timeout = time.AfterFunc(p.cfg.PrefillTimeout, func() { lc.onLoop(r, lc.prefillTimedOut) })
	lc.prefill = true
	lc.sentp, lc.sent = p.bufs.getChunk()
	if len(p.strip) > 0 { // --prefill-strip-headers: the prefill leg's own head (prefillheaders.go)
		lc.sent = appendLegStartStrip(lc.sent, &ll.req, p.strip)
	} else {
		lc.sent = append(lc.sent, pd.start...)
	}
	lc.startHedge() // lanehedge.go
	lc.legTo(hp, body, scratch)
}

// prefillHead begins reading the prefill's answer, whose head is in
// ll.resp, rest the body bytes that came with it.
func (lc *laneConn) prefillHead(rest []byte) {
	lc.up.fresh = false
	lc.head = nil
	lc.state = laneAnswer
	if lc.ll.resp.ConnectionClose() {
		lc.up.keep = false
	}
	lc.readWhole(upstream.HeadDecoder(&lc.ll.resp), rest)
}

// prefillAnswered takes the prefill's answer, read whole.
func (lc *laneConn) prefillAnswered(a *rawAnswer) {
	res, err := lc.r.prefillAnswered(a.status, a.head.ContentType(), a.buf)
	if err != nil {
		lc.prefillFailed(err)
		return
	}
	lc.prefillEnded(res, nil)
}

// prefillFailed handles a failed prefill attempt: a retryable failure is
// tried again after --prefill-retry-backoff (while --prefill-timeout
// allows); any other, or the last, ends the prefill.
func (lc *laneConn) prefillFailed(err error) {
	r, p, pd := lc.r, lc.ll.ln.p, lc.pd
	if !classify(err).retry || pd.attempts >= p.cfg.PrefillMaxRetries {
		lc.prefillEnded(prefillResult{}, err)
		return
	}
	pd.attempts++
	pd.last = err
	p.m.PrefillRetries.WithLabelValues(r.label).Inc()
	r.logAt(zerolog.WarnLevel).Err(err).Int("attempt", pd.attempts).Msg("prefill failed; retrying")
	lc.state = laneBackoff
	lc.startTimer(p.cfg.PrefillRetryBackoff, lc.retryPrefill)
}

// retryPrefill sends the prefill leg again.
func (lc *laneConn) retryPrefill() {
	if lc.state != laneBackoff {
		return
	}
	lc.retried = false
	lc.connect()
}

// prefillTimedOut ends a prefill that ran past --prefill-timeout, its
// retries included.
func (lc *laneConn) prefillTimedOut() {
	if !lc.prefill {
		return // ended meanwhile
	}
	r := lc.r
	lc.stopTimer()
	lc.endUp(false)
	lc.dropRaw()
	err := fmt.Errorf("%w after %v", ErrPrefillTimeout, r.p.cfg.PrefillTimeout)
	if last := lc.pd.last; last != nil {
		err = fmt.Errorf("%w (after %w)", err, last)
	}
	lc.prefillEnded(prefillResult{}, err)
}

// endPrefill ends the prefill's bookkeeping, once: its duration, the
// breaker's ticket, the in-flight gauge.
func (lc *laneConn) endPrefill(err error) {
	pd := lc.pd
	if pd == nil || pd.tk == nil {
		return
	}
	lc.prefill = false
	pd.timeout.Stop()
	pd.stopHedgeTimer()
	pd.done(err)
	pd.tk.Done(breakerResult(err))
	pd.tk = nil
	r := lc.r
	r.p.guard.trackCircuit(r.prefiller)
	lc.setGauge(nil)
}

// prefillEnded goes on from the prefill's result, as serveInference does.
func (lc *laneConn) prefillEnded(res prefillResult, err error) {
	r, p := lc.r, lc.ll.ln.p
	lc.putSent()
	lc.endPrefill(err)
	if lc.hedgeSettled(err) {
		return // the hedge's local leg is the fallback (lanehedge.go)
	}
	if err != nil {
		var rej *rejected
		if errors.As(err, &rej) {
			r.logAt(zerolog.InfoLevel).Int("status", rej.status).Msg("prefiller rejected the request; answer passed on")
			lc.answerWhole(metrics.ModeDisaggregated, rej.status, rej.contentType, rej.body)
			return
		}
		lc.fallback(err)
		return
	}
	if res.handoff.Done {
		lc.answerFromPrefill(res)
		return
	}
	if err := p.tpGuard(res.handoff); err != nil {
		lc.fallback(err)
		return
	}
	scratch, dst := p.bufs.editScratch(len(r.body))
	body, err := p.seq.DecodeBody(dst, r.api, r.body, res.handoff)
	if err != nil {
		p.bufs.putScratch(scratch)
		lc.failWith(err)
		return
	}
	r.mode, r.handoff = metrics.ModeDisaggregated, &res.handoff
	lc.decodeLeg(body, scratch, true)
}

// answerFromPrefill serves a request whose generation ended on the
// prefill's first token, as the fasthttp path's answerFromPrefill does.
func (lc *laneConn) answerFromPrefill(res prefillResult) {
	ct, ans, err := lc.r.prefillAnswer(res)
	if err != nil {
		lc.fallback(err)
		return
	}
	lc.answerWhole(metrics.ModeDisaggregated, fasthttp.StatusOK, ct, ans)
}

// fallback degrades the request to a local prefill with the client's
// body, or answers the error, as the fasthttp path's fallback does.
func (lc *laneConn) fallback(cause error) {
	if !lc.r.degrade(cause) {
		lc.failWith(cause)
		return
	}
	lc.decodeLeg(lc.r.body, nil, false)
}

// remoteAnswered writes the decode leg's non-streamed answer, read whole,
// as relayJSON does: a KV load failure degrades to a local prefill.
func (lc *laneConn) remoteAnswered(a *rawAnswer) {
	r, p := lc.r, lc.ll.ln.p
	r.kvHandoffDone(lc.pd.sent, a.status == fasthttp.StatusOK)
	if a.status == fasthttp.StatusInternalServerError && r.kvLoadFailed() {
		r.handoff = nil
		lc.fallback(ErrKVLoadFailed)
		return
	}
	buf := a.buf
	if a.status == fasthttp.StatusOK && p.rewriter != nil {
		buf = p.rewriter.RewriteAnswer(r.api, buf, *r.handoff)
	}
	r.jsonAnswered(a.status)
	lc.writeWhole(&a.head, buf)
}

// gateStream holds the decode leg's stream back until its first output,
// and gives it the cached_tokens rewrite.
func (lc *laneConn) gateStream(ls *loopStream) {
	r := lc.r
	if rw := r.p.rewriter; rw != nil {
		h := *r.handoff
		ls.fn = func(d []byte) []byte { return rw.RewriteAnswer(r.api, d, h) }
	}
	ls.gate = gateHolding
	ls.gated = lc.gateDone
}

// gateDone decides on a held stream: relayed once its first output came;
// a KV load failure degrades to a local prefill; a stream that ended with
// no output is answered with the error.
func (lc *laneConn) gateDone(g gateState, held []byte) {
	r, ls := lc.r, lc.ls
	lc.stopTimer()
	switch {
	case g == gateHolding: // ended with no output
		lc.dropStream()
		lc.failWith(decodeTransportErr(endedEarly(lc.r.local, "any output", ls.cut)))
		return
	case g == gateError:
		r.kvHandoffDone(lc.pd.sent, false)
		if r.kvLoadFailed() {
			lc.dropStream()
			r.handoff = nil
			lc.fallback(ErrKVLoadFailed)
			return
		}
	default:
		r.kvHandoffDone(lc.pd.sent, true)
	}
	r.p.m.Requests.WithLabelValues(r.mode, statusLabel(r.obs.status)).Inc()
	ls.ttftSeen = true
	lc.firstOutput()
	ls.write(held)
}

// dropStream ends a held stream the client never saw: its leg is closed,
// and the request goes on.
func (lc *laneConn) dropStream() {
	ls := lc.ls
	ls.finished = true
	ls.closeLeg(false)
	lc.ls = nil
	lc.state = laneSending
	if lc.streamed {
		lc.streamed = false
		lc.r.p.m.LoopStreams.Dec()
	}
}

// endSplit frees the split's state once the request is over.
func (lc *laneConn) endSplit() {
	if pd := lc.pd; pd != nil {
		lc.pd = nil
		lc.ll.ln.p.bufs.putChunk(pd.bufp, pd.buf)
	}
}
