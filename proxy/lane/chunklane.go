package lane

import (
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/netloop"
	"github.com/pd-sidecar/pd-sidecar/proxy/chunked"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// laneChunk is a chunked decode (--decode-chunk-size; proxy/chunked) the
// lane runs for its connection's request: it executes the decode's
// machine, fasthttp's driver's decisions, with the lane's legs (each chunk
// a leg whose answer is read whole) and its own writes of the client's
// stream.
type laneChunk struct {
	lc *laneConn
	m  *chunked.Machine
	// buf holds the legs' head start and the decode's body, copied out
	// of the loop's buffers (the next event reuses them); bufp is its pool
	// buffer.
	buf, start []byte
	bufp       *[]byte
	leg        bool      // a chunk's leg is in flight
	handoff    bool      // and carries the split's KV handoff
	sent       time.Time // when the handoff's chunk was sent

	// The client's stream, once begun.
	streaming bool
	pending   []byte // what the client has not taken yet
	last      bool   // pending (or the last write) ends the stream
}

// startChunked runs the decode of body (held in bodyp, or nil) on the
// local engine as chunks (Request.ChunkPlan said it applies): remote, a
// split's. The plan is made again of the decode's own copy of the body,
// which it reads from.
func startChunked(lc *laneConn, body []byte, bodyp *[]byte, remote bool) {
	ll, r, p := lc.ll, lc.r, lc.ll.ln.p
	c := &laneChunk{lc: lc}
	c.bufp, c.buf = p.Bufs.GetChunk()
	if lc.split.pd != nil {
		c.buf = append(c.buf, lc.split.pd.start...)
	} else {
		c.buf = rawhttp.AppendLegStartStrip(c.buf, &ll.req, p.LegStrip)
	}
	n := len(c.buf)
	c.bufp, c.buf = p.Bufs.GrowChunk(c.bufp, c.buf, len(body))
	c.buf = append(c.buf, body...)
	p.Bufs.PutScratch(bodyp)
	c.start, body = c.buf[:n:n], c.buf[n:]
	plan, _ := lc.r.ChunkPlan(body, remote)
	lc.chunk = c
	lc.setGauge(nil) // the decode's own gauge counts it (chunked.Job)
	r.DecodeStarted(remote)
	c.m = chunked.NewMachine(p.ChunkDeps(), laneRecorder{r}, r.ChunkJob(plan, body, remote))
	c.exec(c.m.Start())
}

// laneRecorder is the request's part in its chunked decode on the lane.
type laneRecorder struct{ r *core.Request }

func (l laneRecorder) Gone() bool                          { return l.r.Gone() }
func (l laneRecorder) Left()                               { relay.Left(l.r) }
func (l laneRecorder) Report(chunks int)                   { l.r.Obs.Chunks = chunks }
func (l laneRecorder) Log(lv zerolog.Level) *zerolog.Event { return l.r.LogAt(lv) }

// exec executes the machine's actions, and those they lead to, while the
// decode is the connection's.
func (c *laneChunk) exec(acts []chunked.Action) {
	for i, a := range acts {
		if c.lc.chunk != c {
			return // the request ended meanwhile
		}
		switch a.Op {
		case chunked.SendChunk:
			c.send(a.Body, a.Handoff)
		case chunked.AnswerWhole:
			c.answerWhole(a)
		case chunked.BeginStream:
			c.begin(a)
		case chunked.WriteEvents:
			c.write(a.Body, i+1 < len(acts) && acts[i+1].Op == chunked.EndStream)
		case chunked.EndStream: // written with the last WriteEvents
		case chunked.AbortStream:
			c.clientGone()
		case chunked.Return:
			c.ret(a.Err)
		}
	}
}

// send sends a chunk's leg to the local engine.
func (c *laneChunk) send(body []byte, handoff bool) {
	lc := c.lc
	lc.leg.sentp, lc.leg.sent = lc.ll.ln.p.Bufs.GetChunk()
	lc.leg.sent = append(lc.leg.sent, c.start...)
	lc.leg.prefill = false
	c.leg, c.handoff = true, handoff
	if handoff {
		c.sent = time.Now()
	}
	lc.leg.legTo(lc.r.Local, body, nil)
}

// head begins reading a chunk's answer, whose head is in the loop's
// answer header, rest the body bytes that came with it: read whole.
func (c *laneChunk) head(rest []byte) {
	lc := c.lc
	lc.leg.up.fresh = false
	lc.leg.putSent()
	lc.leg.head = nil
	if lc.ll.resp.ConnectionClose() {
		lc.leg.up.keep = false
	}
	lc.state = laneAnswer
	lc.leg.readWhole(upstream.HeadDecoder(&lc.ll.resp), rest)
}

// answered takes a chunk's answer, read whole, to the machine: the
// handoff's chunk ends the KV handoff (a KV load failure is the split's
// to fall back from), and its answer is rewritten as the connector asks.
func (c *laneChunk) answered(a *rawhttp.Answer) {
	lc := c.lc
	r := lc.r
	c.leg = false
	st := a.Status
	if c.handoff {
		if err := r.KVAnswered(c.sent, st); err != nil {
			c.exec(c.m.Failed(err))
			return
		}
	}
	buf := r.ChunkAnswer(st, a.Buf, c.handoff)
	c.exec(c.m.Answered(chunked.Answer{Status: st, ContentType: string(a.Head.ContentType()), Body: append([]byte(nil), buf...)}))
}

// failed takes a chunk's leg that got no answer, or broke off.
func (c *laneChunk) failed(err error) {
	c.leg = false
	c.exec(c.m.Failed(core.DecodeTransportErr(err)))
}

// answerWhole writes the decode's whole answer.
func (c *laneChunk) answerWhole(a chunked.Action) {
	lc := c.lc
	h := lc.reply.ownHead(a.Status, a.ContentType)
	if a.ContentType == "text/event-stream" {
		h.Set("Cache-Control", "no-cache")
	}
	lc.r.AnswerCounted(lc.r.Mode, a.Status)
	lc.reply.writeWhole(h, a.Body)
}

// ret ends a decode that failed before the client saw anything: a split's
// failure it may recover from (a KV that could not be loaded) goes back to
// the split; another error is the client's answer.
func (c *laneChunk) ret(err error) {
	lc := c.lc
	c.release()
	if lc.split.pd != nil && split.Recovers(err) {
		lc.split.feedSplit(split.Event{Kind: split.LegFailed, Err: err})
		return
	}
	lc.reply.failWith(err)
}

// begin answers the stream a begins: a no-cache head, then its first
// events.
func (c *laneChunk) begin(a chunked.Action) {
	lc := c.lc
	r := lc.r
	events := a.Body
	h := lc.reply.ownHead(a.Status, a.ContentType)
	h.Set("Cache-Control", "no-cache")
	r.AnswerCounted(r.Mode, a.Status)
	c.streaming = true
	lc.state = laneAnswer
	_, out := lc.ll.loop.Buffers()
	out = lc.reply.appendHead(out, h, -1)
	out, mark := httpbody.BeginChunk(out)
	out = append(out, events...)
	c.put(httpbody.EndChunk(out, mark))
}

// write writes events to the stream as one chunk of its body; last: they
// end it.
func (c *laneChunk) write(events []byte, last bool) {
	_, out := c.lc.ll.loop.Buffers()
	out, mark := httpbody.BeginChunk(out)
	out = append(out, events...)
	out = httpbody.EndChunk(out, mark)
	if last {
		out = append(out, httpbody.LastChunk...)
	}
	c.last = last
	c.put(out)
}

// put sends b to the client; what does not fit waits for the client to
// take it, and the next chunk waits with it.
func (c *laneChunk) put(b []byte) {
	lc := c.lc
	if len(c.pending) > 0 {
		c.pending = append(c.pending, b...)
		return
	}
	n, err := netloop.Write(lc.client.fd, b)
	switch {
	case err == nil:
		c.taken()
	case errors.Is(err, netloop.ErrWouldBlock):
		c.pending = append(c.pending[:0], b[n:]...)
		lc.r.LogAt(zerolog.DebugLevel).Int("pending", len(c.pending)).Msg("client slower than its chunked decode: next chunk held")
		if err := lc.client.setInterest(netloop.Writable); err != nil {
			c.clientGone()
		}
	default:
		c.clientGone()
	}
}

// ready handles an event of the client connection while the stream runs.
func (c *laneChunk) ready(ev netloop.Events) {
	lc := c.lc
	switch {
	case ev&netloop.HangUp != 0:
		c.clientGone()
	case ev&netloop.Writable != 0 && len(c.pending) > 0:
		n, err := netloop.Write(lc.client.fd, c.pending)
		switch {
		case err == nil:
			c.pending = c.pending[:0]
			if err := lc.client.setInterest(0); err != nil {
				c.clientGone()
				return
			}
			c.taken()
		case errors.Is(err, netloop.ErrWouldBlock):
			c.pending = c.pending[:copy(c.pending, c.pending[n:])]
		default:
			c.clientGone()
		}
	default:
		// A pipelined request: it waits in the socket until the stream
		// is written.
		_ = lc.client.setInterest(lc.client.interest &^ netloop.Readable)
	}
}

// taken: the client took what was written; the stream goes on, or is
// over.
func (c *laneChunk) taken() {
	lc := c.lc
	if !c.last {
		c.exec(c.m.Written())
		return
	}
	c.m.Closed(true)
	keep := lc.client.keepAlive && !lc.ll.ln.p.Draining.Load()
	lc.finish()
	lc.client.done(keep)
}

// clientGone ends a stream whose client left: a chunk's leg on its way is
// dropped, and the decode counted as the client's leaving.
func (c *laneChunk) clientGone() {
	lc := c.lc
	lc.drop(core.ErrClientGone)
	lc.client.close()
}

// release lets go of the decode, once the request ends or the decode
// failed before the answer began: one still running is abandoned
// (chunked.Machine.Abandon).
func (c *laneChunk) release() {
	lc := c.lc
	if lc.chunk != c {
		return
	}
	lc.chunk = nil
	if !c.m.Over() {
		c.m.Abandon()
	}
	lc.ll.ln.p.Bufs.PutChunk(c.bufp, c.buf)
	c.bufp, c.buf, c.start, c.pending = nil, nil, nil, nil
}
