// Package lane is the sidecar's event-loop driver: it serves an inference
// request whose head came whole in one read (local, or a P/D split:
// sequential, both legs at once, or tried on the decode engine first) on
// the loops from its first byte to its last, with no goroutine of
// its own, and gives every other request to fasthttp. It decides nothing a
// request's outcome depends on: the split machines (proxy/split), a chunked
// decode's machine (proxy/chunked) and the request's state
// (proxy/inference) do; the lane does their I/O.
package lane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/netloop"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The lane serves the common request on the event loops from its first
// byte to its last: an inference request whose head came whole in the
// loop's first read (its body read on the loop as it comes: laneBody), with no
// prefiller named (a local prefill and decode) or one (the P/D split, run
// by the split machines: sequential, paired with both legs at once, or
// decode-first). Such a request then has no goroutine of its own and is
// handed between none: the loop that saw the client's bytes writes the
// legs to pooled upstream connections it also watches, and relays the
// answer (a stream through a loopStream, as a stream handed over by
// fasthttp is relayed). Between requests the client connection waits on
// the loop too, holding nothing but its handler.
//
// A blocking call a request needs (a dial, the sidecar's KV pull, a
// prefill leg over TLS, an encoder stage's fan-out, a bootstrap query)
// runs on a goroutine that does only that call, and the request goes on on
// the loop with its outcome.
//
// Every other request (a head split across reads, a request the guards
// refuse, GET /v1/models, /metrics, TLS from the client, a MoRI-IO split
// whose host specs have no address yet...) is given to fasthttp
// with the bytes the lane read (clientconn.Conn.Replay), and comes back to the
// lane once fasthttp reads for the next one. The lane's failures (an
// upstream unreachable, no answer head in time, the client leaving, a
// prefill to retry or to fall back from) are answered as the fasthttp path
// answers them, with the same accounting.
type lane struct {
	p     *inference.Proxy
	local string // the engine's address
	srv   *fasthttp.Server
	loops []*laneLoop
	next  atomic.Uint32

	mu    sync.Mutex
	conns map[*laneConn]struct{} // every client connection on the lane
	stop  chan struct{}          // closed by shutdown
	once  sync.Once
}

// laneLoop is a lane's state on one loop: its engine connections and the
// parsers, used only on the loop's goroutine.
type laneLoop struct {
	ln   *lane
	loop *netloop.Loop

	mu   sync.Mutex
	idle map[string][]*upConn // pooled upstream connections by address

	req  fasthttp.RequestHeader  // key normalizing off (as rawhttp reads heads)
	resp fasthttp.ResponseHeader // likewise
	uri  fasthttp.URI            // the Host, parsed as fasthttp's path parses it
	rd   bytes.Reader
	br   *bufio.Reader

	// the in-flight gauges of the phases
	local, prefill, decode prometheus.Gauge
}

// New starts the lane of the local engine at local on loops; srv, the
// engine port's fasthttp server, takes back the connections the lane
// does not serve (an inference.LaneFunc).
func New(p *inference.Proxy, local string, srv *fasthttp.Server, loops []*netloop.Loop) inference.Lane {
	return newLane(p, local, srv, loops)
}

func newLane(p *inference.Proxy, local string, srv *fasthttp.Server, loops []*netloop.Loop) *lane {
	ln := &lane{p: p, local: local, srv: srv, conns: map[*laneConn]struct{}{}, stop: make(chan struct{})}
	for _, l := range loops {
		ll := &laneLoop{ln: ln, loop: l, br: bufio.NewReaderSize(nil, p.Cfg.Guard.MaxHeaderBytes),
			idle:    map[string][]*upConn{},
			local:   p.M.Inflight.WithLabelValues(metrics.PhaseLocal),
			prefill: p.M.Inflight.WithLabelValues(metrics.PhasePrefill),
			decode:  p.M.Inflight.WithLabelValues(metrics.PhaseDecode)}
		ll.req.DisableNormalizing()
		ll.resp.DisableNormalizing()
		ln.loops = append(ln.loops, ll)
	}
	go ln.sweep()
	return ln
}

// slash is the target a Host is parsed with.
var slash = []byte("/")

// laneIdleMax is how long a pooled upstream connection may stay unused (as
// the fasthttp pool's MaxIdleConnDuration).
const laneIdleMax = 4 * time.Second

// Adopt implements clientconn.Adopter: it takes c, which waits for its
// next request, onto a loop.
func (ln *lane) Adopt(c *clientconn.Conn) {
	fd, ok := netloop.FD(c.TCPConn)
	if !ok || ln.p.Draining.Load() {
		_ = c.TCPConn.Close()
		return
	}
	ll := ln.loops[int(ln.next.Add(1))%len(ln.loops)]
	lc := newConn(ll)
	lc.client.cc, lc.client.fd, lc.client.interest, lc.client.since = c, fd, netloop.Readable, time.Now()
	ln.mu.Lock()
	select {
	case <-ln.stop:
		ln.mu.Unlock()
		_ = c.TCPConn.Close()
		return
	default:
	}
	ln.conns[lc] = struct{}{}
	ln.mu.Unlock()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if err := ll.loop.Add(fd, netloop.Readable, lc); err != nil {
		lc.client.close()
	}
}

// sweep closes client connections idle longer than --idle-timeout, and
// pooled upstream connections unused for laneIdleMax, until shutdown.
func (ln *lane) sweep() {
	idle := ln.p.Cfg.Guard.IdleTimeout
	t := time.NewTicker(min(max(idle/4, 10*time.Millisecond), time.Second))
	defer t.Stop()
	for {
		select {
		case <-ln.stop:
			return
		case now := <-t.C:
			for _, ll := range ln.loops {
				ll.evict(now)
			}
			for _, lc := range ln.snapshot() {
				lc.mu.Lock()
				if lc.state == laneIdle && now.Sub(lc.client.since) >= idle {
					lc.client.close()
				}
				lc.mu.Unlock()
			}
		}
	}
}

func (ln *lane) snapshot() []*laneConn {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	s := make([]*laneConn, 0, len(ln.conns))
	for lc := range ln.conns {
		s = append(s, lc)
	}
	return s
}

// Shutdown closes the idle connections and makes the others close after
// their answer (as fasthttp's Shutdown does with its own).
func (ln *lane) Shutdown() {
	ln.once.Do(func() { close(ln.stop) })
	for _, lc := range ln.snapshot() {
		lc.mu.Lock()
		if lc.state == laneIdle {
			lc.client.close()
		} else {
			lc.client.keepAlive = false
		}
		lc.mu.Unlock()
	}
}

func (ln *lane) forget(lc *laneConn) {
	ln.mu.Lock()
	delete(ln.conns, lc)
	ln.mu.Unlock()
}

// The states of a client connection on the lane.
const (
	laneIdle     = iota // waiting for a request
	laneSending         // connecting to the leg's upstream (off the loop)
	laneWaiting         // the leg is sent; waiting for the answer's head
	laneAnswer          // the answer is read (raw) or relayed (ls)
	laneBackoff         // waiting to send the prefill leg again
	laneReading         // reading the rest of a request's body (laneBody)
	laneStepping        // a step the request waits on runs off the loop (runStep)
	laneGone            // given to fasthttp, or closed
)

// laneConn is one client connection on the lane: the loop's handler of its
// descriptor. Its requests move only on the loop's goroutine (a dial that
// ended and a timer that fired come back to it through Loop.Post, since
// the loop's buffers and parsers are shared by its connections); mu orders
// that with the sweeper and the drain, which close idle connections.
//
// It holds the request and its state, and is made of parts with one job
// each, named values in it that point back to it (a laneConn is made by
// newConn, which wires them): the client side (client: reading requests
// and their bodies), the client's answer (reply), the upstream leg (leg:
// dialled, written, its answer read), its timer (timer) and the split's
// execution (split). A part's fields and methods are reached through its
// name (lc.leg.sent, lc.timer.stopTimer()), not promoted: the
// connection's own methods are only its handler's, its request's and its
// stream's (relay.StreamConns, each a part's); a part reaches the others
// through it.
type laneConn struct {
	mu    sync.Mutex
	ll    *laneLoop
	state int

	r     *core.Request
	gauge prometheus.Gauge // the in-flight gauge of the request's phase
	chunk *laneChunk       // the request's chunked decode, while it runs
	// shadowOf, on a hedge's local leg, is the client
	// connection whose request it runs for: the shadow has that client's
	// request and descriptor but never writes to it, closes it or ends the
	// request; its primary adopts its answer, or drops it.
	shadowOf *laneConn
	// stepGone is why a request whose step runs off the loop ends (its
	// client left, the loop shuts down): it was cancelled, and ends when
	// the step comes back.
	stepGone error

	client laneClient
	reply  laneReply
	leg    laneLeg
	timer  laneTimer
	split  laneSplit
}

// newConn returns a connection of loop ll, its parts wired to it.
func newConn(ll *laneLoop) *laneConn {
	lc := &laneConn{ll: ll}
	lc.client.lc, lc.reply.lc, lc.leg.lc, lc.timer.lc, lc.split.lc = lc, lc, lc, lc, lc
	lc.split.prefillDue.lc, lc.split.hedgeDue.lc = lc, lc
	return lc
}

// Ready implements netloop.Handler.
func (lc *laneConn) Ready(fd int, ev netloop.Events) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	switch {
	case lc.state == laneGone:
	case lc.state == laneStepping:
		// The request is its step's until it comes back: it is only
		// cancelled now.
		var cause error
		switch {
		case ev&netloop.Shutdown != 0:
			cause = core.ErrDrainTimeout
		case ev&netloop.HangUp != 0:
			cause = core.ErrClientGone
		default:
			lc.client.setInterest(lc.client.interest &^ netloop.Readable)
			return
		}
		if lc.stepGone == nil {
			lc.stepGone = cause
			lc.r.Cancel(cause)
		}
	case ev&netloop.Shutdown != 0:
		if lc.state == laneIdle {
			lc.client.close()
			return
		}
		lc.abandon(core.ErrDrainTimeout)
	case lc.chunk != nil && lc.chunk.streaming:
		lc.chunk.ready(ev)
	case lc.state == laneIdle:
		lc.client.readRequest(ev)
	case lc.state == laneReading:
		lc.client.readBody()
	case lc.state == laneAnswer && lc.reply.ls != nil:
		if ev&(netloop.HangUp|netloop.Writable) == 0 {
			// A pipelined request: it waits in the socket until this answer
			// is written.
			lc.client.setInterest(lc.client.interest &^ netloop.Readable)
			return
		}
		if ev&netloop.HangUp != 0 && lc.reply.ls.Gate.Shut() {
			// The client left before its answer began (the stream is
			// still held back): counted as the fasthttp path counts it.
			lc.reply.dropStream()
			lc.clientLeft()
			return
		}
		lc.reply.ls.Handle(fd, ev)
	case ev&netloop.HangUp != 0:
		lc.clientLeft()
	default:
		lc.client.setInterest(lc.client.interest &^ netloop.Readable)
	}
}

// serve serves the request b, whole and parsed into the loop's header
// (parseHead), unless the guard refuses it (then fasthttp answers it).
func (lc *laneConn) serve(b []byte, api connectors.API, headLen int, lr rawhttp.Request) {
	ll := lc.ll
	p := ll.ln.p
	if !p.Guard.Acquire() {
		lc.client.toServer(b, time.Now()) // whole: nothing is left to read
		return
	}
	r := p.StartRequest(core.Arrival{ID: lr.ID, Head: &ll.req, Body: b[headLen:], Local: ll.ln.local, API: api,
		Client: clientconn.PeerAddr(lc.client.cc.RemoteAddr())})
	lc.r, lc.client.keepAlive = r, lr.KeepAlive
	p.LoopRequests.Add(1)
	// Counted as the lane takes it, before any answer byte: a client that
	// has its answer finds it counted.
	p.M.LoopRequests.Inc()
	named := len(ll.req.Peek(core.HeaderPrefiller)) > 0 // as Admit reads it
	if named {
		lc.split.beginSplit(true) // copies the body
	}
	a := r.Admit(&ll.req)
	if a.Wait != nil {
		if !named {
			lc.split.beginSplit(false) // copies the head and the body
		}
		// Admit goes on with a copy of the head: the loop's parser goes on
		// to other requests.
		h := &fasthttp.RequestHeader{}
		h.DisableNormalizing()
		ll.req.CopyTo(h)
		lc.admitAfter(a.Wait, h)
		return
	}
	lc.route(a)
	if !named {
		r.Body = nil // maybe in the loop's buffer, which the next read overwrites
	}
}

// admitAfter runs step, which the request's admission waits on, and then
// goes on with the admission (of head h).
func (lc *laneConn) admitAfter(step feature.Step, h *fasthttp.RequestHeader) {
	lc.runStep(step, func() {
		a := lc.r.Admit(h)
		if a.Wait != nil {
			lc.admitAfter(a.Wait, h)
			return
		}
		lc.route(a)
	})
}

// route sends the request where Admit said.
func (lc *laneConn) route(a core.Admission) {
	switch a.Route {
	case core.RouteFail:
		lc.reply.failWith(a.Err)
	case core.RouteFallback:
		lc.split.refused(a.Err)
	case core.RouteLocal:
		lc.serveLocal()
	default:
		lc.split.run()
	}
}

// runStep runs step, a blocking call the request waits on (an encoder
// stage, a bootstrap query, the sidecar's KV pull, a DNS lookup), on a
// goroutine of its own, as a dial is; next goes on from it, on the loop.
// The request is the step's until it comes back: a client that leaves
// meanwhile only cancels it (the step then returns), and is counted when
// it does.
func (lc *laneConn) runStep(step feature.Step, next func()) {
	r := lc.r
	lc.state, lc.stepGone = laneStepping, nil
	r.Logger() // built here: the step may log with it
	go func() {
		then := step(r.Ctx)
		lc.onLoop(r, func() {
			if lc.state != laneStepping {
				return
			}
			lc.state = laneSending
			switch cause := lc.stepGone; {
			case errors.Is(cause, core.ErrClientGone):
				lc.clientLeft()
			case cause != nil:
				lc.abandon(cause)
			default:
				then()
				next()
			}
		})
	}()
}

// decodeLeg sends body (held in bodyp, or nil: see legTo) to the local
// engine: the decode leg carrying the remote KV (remote), or a local
// prefill and decode.
func (lc *laneConn) decodeLeg(body []byte, bodyp *[]byte, remote bool) {
	ll, r, p := lc.ll, lc.r, lc.ll.ln.p
	if _, ok := r.ChunkPlan(body, remote); ok && lc.shadowOf == nil && !(remote && lc.split.pd.paired != nil) {
		startChunked(lc, body, bodyp, remote) // --decode-chunk-size
		return
	}
	if remote {
		lc.setGauge(ll.decode)
		lc.split.pd.sent = time.Now()
	} else {
		lc.setGauge(ll.local)
	}
	r.DecodeStarted(remote)
	lc.leg.sentp, lc.leg.sent = p.Bufs.GetChunk()
	if lc.split.pd != nil {
		lc.leg.sent = append(lc.leg.sent, lc.split.pd.start...)
	} else {
		lc.leg.sent = rawhttp.AppendLegStartStrip(lc.leg.sent, &ll.req, p.LegStrip)
	}
	lc.timer.boundFirstByte()
	lc.leg.prefill = false
	lc.leg.legTo(r.Local, body, bodyp)
}

// setGauge moves the request to in-flight gauge g (nil: none).
func (lc *laneConn) setGauge(g prometheus.Gauge) {
	if lc.gauge != nil {
		lc.gauge.Dec()
	}
	if lc.gauge = g; g != nil {
		g.Inc()
	}
}

// parse parses b as one whole request the lane may serve, and returns its
// API, body (a sub-slice of b) and what the lane needs of its headers.
func (ll *laneLoop) parse(b []byte) (api connectors.API, body []byte, lr rawhttp.Request, ok bool) {
	api, headLen, want, lr, ok := ll.parseHead(b)
	if !ok || want != len(b) {
		return 0, nil, lr, false
	}
	return api, b[headLen:], lr, true
}

// parseHead parses the head at the start of b, of a request the lane may
// serve, and returns its API, the head's length, the bytes the whole
// request takes (want: head and Content-Length; more than len(b) when its
// body is still to come) and what the lane needs of its headers. Bytes in b
// past the request (a pipelined one) make it fasthttp's. With a tracer,
// the trace context is read from the loop's parsed head and each leg's
// own is written into its head (observe.Request.AppendTrace).
func (ll *laneLoop) parseHead(b []byte) (api connectors.API, headLen, want int, lr rawhttp.Request, ok bool) {
	p := ll.ln.p
	if p.Draining.Load() {
		return 0, 0, 0, lr, false
	}
	h := &ll.req
	h.Reset()
	ll.rd.Reset(b)
	ll.br.Reset(&ll.rd)
	if err := h.Read(ll.br); err != nil {
		return 0, 0, 0, lr, false // not whole, or malformed: fasthttp answers it
	}
	headLen = len(b) - ll.rd.Len() - ll.br.Buffered()
	cl := h.ContentLength()
	if !h.IsPost() || !h.IsHTTP11() || cl < 0 || headLen+cl < len(b) || cl > p.Cfg.MaxRequestBodyBytes {
		return 0, 0, 0, lr, false
	}
	if lr = rawhttp.ScanRequest(h); lr.Refused {
		return 0, 0, 0, lr, false
	}
	// A Host fasthttp's parser refuses (400) is its to refuse; the target
	// is an inference path exactly, or fasthttp's (proxy/front's checks). A Host
	// seen last is not parsed again (URI.Parse keeps it).
	if ll.uri.Parse(h.Host(), slash) != nil {
		return 0, 0, 0, lr, false
	}
	api, ok = connectors.APIForPath(string(h.RequestURI()))
	return api, headLen, headLen + cl, lr, ok
}

// pop takes a pooled connection to addr, nil when none is fit.
func (ll *laneLoop) pop(addr string) *upConn {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	now := time.Now()
	idle := ll.idle[addr]
	for len(idle) > 0 {
		u := idle[len(idle)-1]
		idle = idle[:len(idle)-1]
		ll.idle[addr] = idle
		// The loop drops a pooled connection on its first event, but one
		// may be waiting in this round of events: a connection the upstream
		// sent something on while no request was outstanding (an answer to
		// a request never sent), or closed, is not used.
		if now.Sub(u.since) < laneIdleMax && upstream.FdQuiet(u.fd) {
			return u
		}
		u.close()
	}
	return nil
}

// put pools u once its answer was read whole: up to MaxConnsPerHost
// connections to an address (over all loops), for as many addresses as
// the transport keeps pools for (forged prefiller addresses cannot grow
// the pool), plus the local engine.
func (ll *laneLoop) put(u *upConn) {
	ll.mu.Lock()
	u.owner, u.since = nil, time.Now()
	idle, known := ll.idle[u.addr]
	if (known || len(ll.idle) <= ll.ln.p.Tr.MaxHosts()) && len(idle) < max(ll.ln.p.Cfg.MaxConnsPerHost/len(ll.ln.loops), 1) {
		ll.idle[u.addr] = append(idle, u)
		ll.mu.Unlock()
		return
	}
	ll.mu.Unlock()
	u.close()
}

// evict closes the pooled connections unused for laneIdleMax, and forgets
// the addresses left with none.
func (ll *laneLoop) evict(now time.Time) {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	for addr, idle := range ll.idle {
		kept := idle[:0]
		for _, u := range idle {
			if now.Sub(u.since) < laneIdleMax {
				kept = append(kept, u)
			} else {
				u.close()
			}
		}
		clear(idle[len(kept):])
		if len(kept) == 0 && addr != ll.ln.local {
			delete(ll.idle, addr)
			continue
		}
		ll.idle[addr] = kept
	}
}

// unpool removes u from the pool (under ll.mu), reporting whether it was
// there.
func (ll *laneLoop) unpool(u *upConn) bool {
	idle := ll.idle[u.addr]
	for i, x := range idle {
		if x == u {
			ll.idle[u.addr] = append(idle[:i], idle[i+1:]...)
			return true
		}
	}
	return false
}

// onLoop runs f, for request r, on the loop (for an event off the loop: a
// timer that fired), unless the connection has gone on to another
// request by then.
func (lc *laneConn) onLoop(r *core.Request, f func()) {
	lc.ll.loop.Post(func() {
		mu := lc.lock()
		mu.Lock()
		defer mu.Unlock()
		if lc.r == r {
			f()
		}
	})
}

// failed answers a request whose decode leg got no answer head.
func (lc *laneConn) failed(err error) {
	if c := lc.chunk; c != nil && c.leg {
		c.failed(err)
		return
	}
	if lc.split.pairedSplit().decodeEnded(core.DecodeTransportErr(err)) || lc.split.decodeFirst().failed(err) {
		return
	}
	lc.reply.failWith(core.DecodeTransportErr(err))
}

// clientLeft ends a request whose client hung up before its answer began:
// the engine connection is closed, so the engine drops the request.
func (lc *laneConn) clientLeft() {
	if r := lc.r; r != nil {
		r.LeftBeforeAnswer(core.ErrClientGone)
		lc.drop(core.ErrClientGone)
	}
	lc.client.close()
}

// abandon ends a request the lane cannot carry on (the loop shutting down).
func (lc *laneConn) abandon(err error) {
	if lc.shadowOf != nil {
		lc.shadowOf.split.shadowFailed(lc, err)
		return
	}
	if lc.reply.ls != nil {
		lc.reply.ls.Fail(err)
		return
	}
	if r := lc.r; r != nil {
		r.LogAt(zerolog.ErrorLevel).Err(err).Msg("request ended by the sidecar; connections closed")
		lc.drop(err)
	}
	lc.client.close()
}

// drop ends a request before its answer began: the upstream connection
// is closed, so the upstream drops it too.
func (lc *laneConn) drop(cause error) {
	lc.r.Cancel(cause)
	lc.split.endSplitEarly(cause)
	lc.timer.stopTimer()
	lc.leg.putSent()
	lc.leg.endUp(false)
	lc.leg.dropRaw()
	lc.finish()
}

// finish ends the request's bookkeeping (the lane's version of
// request.finish), once.
func (lc *laneConn) finish() {
	r := lc.r
	if r == nil {
		return
	}
	if lc.shadowOf != nil {
		lc.shadowOf.split.shadowFailed(lc, errHedgeAbandoned)
		return
	}
	if lc.chunk != nil {
		lc.chunk.release()
	}
	lc.split.dropHedge()
	if ps := lc.split.pairedSplit(); ps != nil {
		ps.end()
	}
	lc.ReleaseKV() // --release-kv-on-cancel: before the split's buffers are given back
	lc.r, lc.leg.prefill = nil, false
	lc.leg.putSent()
	lc.client.dropReqBody()
	lc.leg.dropRaw()
	lc.split.endSplit()
	lc.setGauge(nil)
	r.Report()
	r.P.Guard.Release()
	r.Cancel(context.Canceled)
	if lc.reply.streamed {
		lc.reply.streamed = false
		r.P.M.LoopStreams.Dec()
	}
	lc.ll.ln.p.LoopRequests.Add(-1)
}

// ReleaseKV is core.ReleaseKV for the lane's request, whose legs' head
// start is the split's (the loop's parsed head is another request's by
// now).
func (lc *laneConn) ReleaseKV() {
	if r := lc.r; r != nil && r.KVPending != nil && lc.split.pd != nil {
		core.ReleaseKV(r, lc.split.pd.start)
	}
}

// upConn is a pooled upstream connection of the lane (to the local engine
// or a prefiller), watched by its loop for as long as it lives: while idle
// in the pool, any event means the upstream closed it (or sent what nobody
// asked for), and it is dropped.
type upConn struct {
	ll      *laneLoop
	addr    string
	conn    net.Conn
	fd      int
	owner   *laneConn // nil while pooled (under ll.mu)
	since   time.Time // pooled since
	fresh   bool      // dialled for the request it carries
	keep    bool      // the engine did not say Connection: close
	watched bool
	writing bool // watched for Writable too: a request waits to be written
}

// Ready implements netloop.Handler.
func (u *upConn) Ready(fd int, ev netloop.Events) {
	u.ll.mu.Lock()
	lc := u.owner
	if lc == nil {
		// Pooled: the upstream closed it. (Closed under ll.mu, as pop and
		// evict close theirs: each pooled connection once.)
		if u.ll.unpool(u) {
			u.close()
		}
		u.ll.mu.Unlock()
		return
	}
	u.ll.mu.Unlock()
	if ev&netloop.Shutdown != 0 {
		mu := lc.lock()
		mu.Lock()
		if lc.leg.up == u {
			lc.abandon(core.ErrDrainTimeout)
		}
		mu.Unlock()
		return
	}
	lc.leg.upReady(u, ev)
}

func (u *upConn) watch() error {
	if u.watched {
		return nil
	}
	if err := u.ll.loop.Add(u.fd, netloop.Readable, u); err != nil {
		return err
	}
	u.watched = true
	return nil
}

func (u *upConn) unwatch() error {
	if !u.watched {
		return nil
	}
	u.watched = false
	return u.ll.loop.Remove(u.fd)
}

func (u *upConn) close() {
	_ = u.unwatch()
	_ = u.conn.Close()
}

var (
	_ netloop.Handler   = (*laneConn)(nil)
	_ netloop.Handler   = (*upConn)(nil)
	_ relay.StreamConns = (*laneConn)(nil)
	_ relay.StreamConns = (*relay.LegConns)(nil)
)

// lock returns the mutex that orders the connection's callbacks: a hedge's
// shadow shares its primary's, so that the two legs of one request move
// one at a time.
func (lc *laneConn) lock() *sync.Mutex {
	if lc.shadowOf != nil {
		return &lc.shadowOf.mu
	}
	return &lc.mu
}

var _ clientconn.Adopter = (*lane)(nil)
