package lane

import (
	"errors"
	"time"

	"github.com/pd-sidecar/pd-sidecar/netloop"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
)

// laneClient is a connection's client side: its descriptor, read for the
// next request and its body (laneBody), handed to fasthttp or closed, and
// waiting between requests.
type laneClient struct {
	lc       *laneConn
	cc       *clientconn.Conn
	fd       int
	interest netloop.Events // what fd is watched for
	since    time.Time      // idle since

	keepAlive bool
	body      *laneBody // a request's body being read (laneReading)
	reqBody   *laneBody // the body of the request being served, read on the lane: its legs send from it
}

// setInterest sets the events fd is watched for.
func (cl *laneClient) setInterest(ev netloop.Events) error {
	lc := cl.lc
	if ev == cl.interest {
		return nil
	}
	cl.interest = ev
	return lc.ll.loop.Modify(cl.fd, ev)
}

// close closes the client connection.
func (cl *laneClient) close() {
	lc := cl.lc
	if lc.state == laneGone || lc.shadowOf != nil {
		return
	}
	lc.state = laneGone
	_ = lc.ll.loop.Remove(cl.fd)
	_ = cl.cc.TCPConn.Close()
	lc.ll.ln.forget(lc)
	if lc.r == nil { // else the request's finish gives it back
		cl.dropReqBody()
	}
	if cl.body != nil {
		lc.timer.stopTimer()
		cl.dropBody(cl.body)
		cl.body = nil
	}
}

// toServer gives the connection to fasthttp, which reads in (the bytes
// read of the next request, which began to arrive at since) first, and the
// rest of the request by --read-timeout from since: fasthttp's own read
// timeout would count from now (clientconn.Conn.Replay).
func (cl *laneClient) toServer(in []byte, since time.Time) {
	lc := cl.lc
	lc.state = laneGone
	_ = lc.ll.loop.Remove(cl.fd)
	lc.ll.ln.forget(lc)
	cl.cc.Replay(in, since.Add(lc.ll.ln.p.Cfg.Guard.ReadTimeout))
	srv := lc.ll.ln.srv
	go func() { _ = srv.ServeConn(cl.cc) }()
}

// readRequest reads the next request; the lane serves it when it is a
// local inference request that came whole, else fasthttp does.
func (cl *laneClient) readRequest(ev netloop.Events) {
	lc := cl.lc
	ll := lc.ll
	in, _ := ll.loop.Buffers()
	n, err := netloop.Read(cl.fd, in)
	switch {
	case errors.Is(err, netloop.ErrWouldBlock):
		if ev&netloop.HangUp != 0 {
			cl.close()
		}
		return
	case err != nil || n == 0:
		cl.close() // the client closed its idle connection
		return
	}
	b := in[:n]
	api, headLen, want, lr, ok := ll.parseHead(b)
	switch {
	case !ok:
		cl.toServer(b, time.Now())
	case want > len(b):
		cl.beginBody(b, headLen, want) // the rest of the body is still to come: laneBody reads it
	default:
		lc.serve(b, api, headLen, lr)
	}
}

// done is the end of an answer: the connection waits for its next request
// (keep), or is closed.
func (cl *laneClient) done(keep bool) {
	lc := cl.lc
	if lc.shadowOf != nil {
		return // the client is the primary's
	}
	lc.reply.ls = nil
	if !keep || lc.state == laneGone {
		cl.close()
		return
	}
	lc.state, cl.since = laneIdle, time.Now()
	if err := cl.setInterest(netloop.Readable); err != nil {
		cl.close()
	}
}

// The client side's part of the connection's relay.StreamConns (its
// loopStream's).

func (lc *laneConn) ClientWatch(ev netloop.Events) error { return lc.client.setInterest(ev) }
func (lc *laneConn) ClientDone(keep bool)                { lc.client.done(keep) }
