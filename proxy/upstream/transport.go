package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// LegError is a transport failure of one upstream leg.
type LegError struct {
	// Addr is the upstream host:port.
	Addr string
	// Op is the step that failed: "dial", "write" or "read".
	Op string
	// Err is the underlying error.
	Err error
}

// Error implements error.
func (e *LegError) Error() string {
	if saysOp(e.Err, e.Op) {
		return e.Err.Error()
	}
	return fmt.Sprintf("%s %s: %v", e.Op, e.Addr, e.Err)
}

// saysOp reports whether err already names step op and its address (a
// *net.OpError of that Op: "dial tcp 10.0.0.5:8000: connect: connection
// refused"), so that a message does not say it twice.
func saysOp(err error, op string) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && ne.Op == op
}

// Unwrap returns the underlying error.
func (e *LegError) Unwrap() error { return e.Err }

// Transport sends requests to upstream engines over pooled fasthttp
// connections, and unlike fasthttp's own Do it cancels a leg at any point
// (dial aside, which --connect-timeout bounds): the connection is closed as
// soon as the leg's context is done, which is how a client leaving or a
// prefill timeout reaches the engine. It is safe for concurrent use.
type Transport struct {
	connectTimeout time.Duration
	maxConns       int
	maxHosts       int
	// maxAnswer bounds an answer read whole (Do); headBytes, an answer's
	// head (the read buffer's size).
	maxAnswer int64
	headBytes int
	// budget is what answers read whole draw from (nil: unbounded).
	budget BufferBudget

	mu    sync.Mutex
	hosts map[string]*hostEntry

	tlsFor func(addr string) *tls.Config // nil: plain TCP (see UseTLS)
}

// NewTransport returns a Transport dialling with connectTimeout, keeping up
// to maxConns connections per upstream and pools for up to maxHosts
// upstreams (prefiller addresses come from a header).
func NewTransport(connectTimeout time.Duration, maxConns, maxHosts int) *Transport {
	return &Transport{
		connectTimeout: connectTimeout,
		maxConns:       maxConns,
		maxHosts:       maxHosts,
		maxAnswer:      DefaultMaxUpstreamAnswerBytes,
		headBytes:      defaultAnswerHeadBytes,
		hosts:          make(map[string]*hostEntry),
	}
}

// hostEntry is one upstream's connection pool.
type hostEntry struct {
	hc   *fasthttp.HostClient
	last time.Time // last use, under Transport.mu
}

// hostIdleEvict is how long a pooled upstream must have been unused before
// a new one may take its slot.
const hostIdleEvict = 30 * time.Second

// host returns addr's connection pool, and whether it is kept (pooled).
// Pools are kept for up to maxHosts upstreams; when the table is full a
// pool unused for hostIdleEvict gives up its slot, and otherwise addr gets
// a one-shot client whose connection is closed after the exchange. So
// forged prefiller addresses can neither grow the table nor churn pools
// (each fasthttp pool runs an idle-connection cleaner goroutine).
func (t *Transport) host(addr string) (*fasthttp.HostClient, bool) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.hosts[addr]; ok {
		e.last = now
		return e.hc, true
	}
	if len(t.hosts) >= t.maxHosts {
		var oldest string
		for k, e := range t.hosts {
			if now.Sub(e.last) >= hostIdleEvict && (oldest == "" || e.last.Before(t.hosts[oldest].last)) {
				oldest = k
			}
		}
		if oldest == "" {
			return t.newHostClient(addr), false
		}
		t.hosts[oldest].hc.CloseIdleConnections()
		delete(t.hosts, oldest)
	}
	hc := t.newHostClient(addr)
	t.hosts[addr] = &hostEntry{hc: hc, last: now}
	return hc, true
}

func (t *Transport) newHostClient(addr string) *fasthttp.HostClient {
	return &fasthttp.HostClient{
		Addr:                     addr,
		MaxConns:                 t.maxConns,
		MaxIdleConnDuration:      4 * time.Second,
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
		ReadBufferSize:           t.headBytes, // an answer head's bound, as the lane's
		Dial:                     t.Dial,
	}
}

// MaxHosts is the number of upstreams the transport keeps a connection
// pool for, at most.
func (t *Transport) MaxHosts() int { return t.maxHosts }

// Hosts is the number of upstreams with a kept connection pool (at most
// MaxHosts).
func (t *Transport) Hosts() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.hosts)
}

// Close closes every idle pooled connection.
func (t *Transport) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.hosts {
		e.hc.CloseIdleConnections()
	}
}

// Do sends req to addr and reads the whole response into resp. The leg ends
// when ctx is done (its deadline bounds the whole exchange). The answer's
// body holds its share of the buffer budget (see AnswerHold), which the
// caller releases when it lets go of resp's body: a body the budget
// refuses fails the exchange with ErrBufferBudget before it is read. On
// failure nothing is held.
func (t *Transport) Do(ctx context.Context, addr string, req *fasthttp.Request, resp *fasthttp.Response) (AnswerHold, error) {
	var hold AnswerHold
	_, err := t.roundTrip(ctx, addr, req, resp, false, 0, &hold)
	return hold, err
}

// Stream sends req to addr and reads the response head into resp; the body
// is read from the returned Leg, which the caller must Close. Cancelling ctx
// unblocks a pending Read with an error.
func (t *Transport) Stream(ctx context.Context, addr string, req *fasthttp.Request, resp *fasthttp.Response) (*Leg, error) {
	return t.roundTrip(ctx, addr, req, resp, true, 0, nil)
}

// ErrFirstByteTimeout: the answer did not begin within the first-byte
// timeout of StreamFirstByteTimeout.
var ErrFirstByteTimeout = errors.New("first answer byte timeout")

// StreamFirstByteTimeout is Stream with the wait for the answer's beginning
// (from sending the request) bounded by firstByte, on the connection's own
// deadline: no timer or context per leg. The bound holds past the head,
// until the caller ends it with Leg.Began: vLLM and SGLang send a stream's
// head at once, before they have made anything. It fails with
// ErrFirstByteTimeout, from this call (no head in time) or from the Leg's
// Read (a head, and no body in time).
func (t *Transport) StreamFirstByteTimeout(ctx context.Context, addr string, req *fasthttp.Request, resp *fasthttp.Response, firstByte time.Duration) (*Leg, error) {
	return t.roundTrip(ctx, addr, req, resp, true, firstByte, nil)
}

// roundTrip runs the exchange; hold, for an answer read whole, is what its
// body reserved.
func (t *Transport) roundTrip(ctx context.Context, addr string, req *fasthttp.Request, resp *fasthttp.Response, stream bool, firstByte time.Duration, hold *AnswerHold) (*Leg, error) {
	hc, pooled := t.host(addr)
	for attempt := 0; ; attempt++ {
		leg, reused, err := t.try(ctx, hc, pooled, req, resp, stream, firstByte, hold)
		// A pooled connection the engine closed while idle fails before any
		// answer byte; that is no verdict on the engine, so try a fresh one.
		if err != nil && reused && attempt == 0 && ctx.Err() == nil && stale(err) {
			continue
		}
		if err != nil {
			return nil, &LegError{Addr: addr, Op: opOf(err), Err: err}
		}
		return leg, nil
	}
}

type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	if saysOp(e.err, e.op) {
		return e.err.Error()
	}
	return e.op + ": " + e.err.Error()
}
func (e *opError) Unwrap() error { return e.err }

func opOf(err error) string {
	var oe *opError
	if errors.As(err, &oe) {
		return oe.op
	}
	return "read"
}

func stale(err error) bool {
	var oe *opError
	if !errors.As(err, &oe) || oe.op == "dial" {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || IsReset(err) ||
		errors.Is(err, fasthttp.ErrConnectionClosed)
}

func (t *Transport) try(ctx context.Context, hc *fasthttp.HostClient, pooled bool, req *fasthttp.Request, resp *fasthttp.Response, stream bool, firstByte time.Duration, hold *AnswerHold) (*Leg, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, &opError{"dial", context.Cause(ctx)}
	}
	start := time.Now()
	t.mu.Lock()
	maxAnswer, budget := t.maxAnswer, t.budget
	t.mu.Unlock()
	if hold != nil {
		hold.b = budget
	}
	cc, err := hc.AcquireConn(0, !pooled)
	// A pooled connection on which the upstream sent something while no
	// request was outstanding (an answer to a request never sent), or which
	// it closed, is dropped: its bytes must not be read as the answer to
	// this one.
	for err == nil && cc.CreatedTime().Before(start) && !idleQuiet(cc.Conn()) {
		hc.CloseConn(cc)
		cc, err = hc.AcquireConn(0, !pooled)
	}
	if err != nil {
		return nil, false, &opError{"dial", err}
	}
	reused := cc.CreatedTime().Before(start)
	conn := cc.Conn()
	hook := context.AfterFunc(ctx, func() { _ = conn.Close() })
	// stop disarms the hook and reports whether it never ran; a leg handed
	// to an event loop disarms it early (Leg.Disarm) and asks again later.
	disarmed := false
	stop := func() bool {
		if !disarmed {
			disarmed = hook()
		}
		return disarmed
	}
	// release returns the connection to the pool only when the exchange
	// ended cleanly and the cancel hook never ran.
	release := func(clean bool) {
		if stop() && clean && pooled && !resp.ConnectionClose() && conn.SetDeadline(time.Time{}) == nil {
			hc.ReleaseConn(cc)
			return
		}
		hc.CloseConn(cc)
	}
	deadline, _ := ctx.Deadline()
	headDeadline := deadline
	if firstByte > 0 {
		if hd := time.Now().Add(firstByte); deadline.IsZero() || hd.Before(deadline) {
			headDeadline = hd
		}
	}
	if err := conn.SetDeadline(headDeadline); err != nil {
		release(false)
		return nil, reused, &opError{"write", err}
	}
	bw := hc.AcquireWriter(conn)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	hc.ReleaseWriter(bw)
	if err != nil {
		release(false)
		return nil, reused, &opError{"write", CtxErr(ctx, err)}
	}
	br := hc.AcquireReader(conn)
	// A streamed answer's head is read here and its body by the Leg, which
	// decodes the framing itself (httpbody): it can then stop at any byte
	// and hand the connection over mid-body (to an event loop).
	if err := ReadAnswer(br, resp, stream, maxAnswer, hold); err != nil {
		if hold != nil {
			hold.Release()
		}
		hc.ReleaseReader(br)
		release(false)
		if !headDeadline.Equal(deadline) && ctx.Err() == nil && IsTimeout(err) {
			err = fmt.Errorf("%w after %v: %w", ErrFirstByteTimeout, firstByte, err)
		}
		return nil, reused, &opError{"read", CtxErr(ctx, err)}
	}
	bounded := !headDeadline.Equal(deadline)
	if bounded && !stream {
		if err := conn.SetDeadline(deadline); err != nil {
			if hold != nil {
				hold.Release()
			}
			hc.ReleaseReader(br)
			release(false)
			return nil, reused, &opError{"read", err}
		}
	}
	if !stream {
		// Bytes after the answer are no answer to anything sent: the
		// connection is not pooled.
		clean := br.Buffered() == 0
		hc.ReleaseReader(br)
		release(clean)
		return nil, reused, nil
	}
	leg := &Leg{addr: hc.Addr, ctx: ctx, br: br, conn: conn, body: bodyDecoder(resp), declared: resp.Header.ContentLength(),
		putReader: hc.ReleaseReader, release: release, stopCancel: stop, budget: budget}
	if bounded {
		leg.firstByte, leg.deadline = firstByte, deadline
	}
	leg.eof = leg.body.Done()
	return leg, reused, nil
}

// CtxErr returns err, a leg's failure, with the context's cause in front
// (both kept for errors.Is) when the context ended the leg.
func CtxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", context.Cause(ctx), err)
	}
	return err
}
