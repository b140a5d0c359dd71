package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
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
func (e *LegError) Error() string { return fmt.Sprintf("%s %s: %v", e.Op, e.Addr, e.Err) }

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

// DefaultMaxUpstreamAnswerBytes is --max-upstream-answer-bytes' default: a
// prefill answer is small JSON, a non-streamed decode answer with logprobs
// a few MiB.
const DefaultMaxUpstreamAnswerBytes = 8 << 20

// defaultAnswerHeadBytes bounds an answer's head when no --max-header-bytes
// is set (as the guard's default).
const defaultAnswerHeadBytes = 8 << 10

// SetAnswerLimits sets the largest answer read whole (maxAnswer) and the
// largest answer head (headBytes), for connections acquired from now on.
func (t *Transport) SetAnswerLimits(maxAnswer int64, headBytes int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.maxAnswer, t.headBytes = maxAnswer, headBytes
}

// BufferBudget is the bound of the bytes buffered at once by all requests
// together (--max-buffered-bytes; *budget implements it), as answers read
// whole draw from it.
type BufferBudget interface {
	// TryReserve reserves n bytes, or reports that they do not fit.
	TryReserve(n int64) bool
	// Release gives back n bytes reserved.
	Release(n int64)
}

// SetAnswerBudget makes answers read whole (Do, and a Leg's body read
// whole) draw from b, for exchanges begun from now on; nil: unbounded.
func (t *Transport) SetAnswerBudget(b BufferBudget) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.budget = b
}

// AnswerHold is the share of the buffer budget an answer read whole holds:
// its body's length (past unreservedBody, which like a request body's is
// part of a connection's fixed cost), reserved before the bytes are kept:
// a declared Content-Length up front, a chunked or close-delimited body in
// steps as it grows (doubling, at least answerStep, never past the
// per-answer bound). The holder gives it back with Release once it lets go
// of the answer's bytes (and of any copy of them it kept). The zero
// AnswerHold holds nothing.
type AnswerHold struct {
	b BufferBudget
	n int64 // bytes reserved
}

// answerStep is the smallest step in which a growing answer is reserved.
const answerStep = 64 << 10

// Release gives the reservation back; a second call does nothing.
func (h *AnswerHold) Release() {
	if h.b != nil && h.n > 0 {
		h.b.Release(h.n)
	}
	h.n = 0
}

// Take moves the reservation into a new hold, which the caller releases
// instead of h.
func (h *AnswerHold) Take() AnswerHold {
	t := *h
	h.n = 0
	return t
}

// cover makes the hold cover size bytes of a body of at most maxBody
// bytes, or fails with ErrBufferBudget (nothing more is then reserved).
func (h *AnswerHold) cover(size, maxBody int64) error {
	if h.b == nil || size <= h.n || size <= unreservedBody {
		return nil
	}
	want := max(size, 2*h.n, answerStep)
	want = max(min(want, maxBody), size)
	if !h.b.TryReserve(want - h.n) {
		return fmt.Errorf("%w (--max-buffered-bytes): an upstream answer of %d bytes or more", ErrBufferBudget, size)
	}
	h.n = want
	return nil
}

// ErrBadUpstreamAnswer: an upstream's answer is not one the sidecar takes:
// a status below 200 other than an interim 100 Continue, a malformed head
// or body, or a body past --max-upstream-answer-bytes. From a prefiller it
// is a failed prefill (bad_answer); from the local engine, a 502.
var ErrBadUpstreamAnswer = errors.New("unacceptable upstream answer")

// ErrAnswerTooLarge: an answer read whole is longer than
// --max-upstream-answer-bytes.
var ErrAnswerTooLarge = fmt.Errorf("%w: longer than --max-upstream-answer-bytes", ErrBadUpstreamAnswer)

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
		Dial:                     t.dial,      // tls.go
	}
}

// Hosts is the number of upstreams with a kept connection pool (at most
// maxHosts).
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

func (e *opError) Error() string { return e.op + ": " + e.err.Error() }
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
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) ||
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
	// to an event loop disarms it early (Leg.disarm) and asks again later.
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
		return nil, reused, &opError{"write", ctxErr(ctx, err)}
	}
	br := hc.AcquireReader(conn)
	// A streamed answer's head is read here and its body by the Leg, which
	// decodes the framing itself (httpbody): it can then stop at any byte
	// and hand the connection over mid-body (loopstream.go).
	if err := readAnswer(br, resp, stream, maxAnswer, hold); err != nil {
		if hold != nil {
			hold.Release()
		}
		hc.ReleaseReader(br)
		release(false)
		if !headDeadline.Equal(deadline) && ctx.Err() == nil && isTimeout(err) {
			err = fmt.Errorf("%w after %v: %w", ErrFirstByteTimeout, firstByte, err)
		}
		return nil, reused, &opError{"read", ctxErr(ctx, err)}
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
	leg := &Leg{ctx: ctx, br: br, conn: conn, body: bodyDecoder(resp), declared: resp.Header.ContentLength(),
		putReader: hc.ReleaseReader, release: release, stopCancel: stop, budget: budget}
	if bounded {
		leg.firstByte, leg.deadline = firstByte, deadline
	}
	leg.eof = leg.body.Done()
	return leg, reused, nil
}

// maxInterim bounds the interim 100 Continue answers skipped before an
// answer.
const maxInterim = 4

// readAnswer reads resp from br: whole, its body at most maxBody bytes and
// reserved in hold (nil: unbounded), or only its head when stream is set. An interim 100 Continue is skipped; any
// other status below 200 is refused (ErrBadUpstreamAnswer), as is a
// malformed head or body: a 101 is no switch the sidecar asked for, and a
// body after it would be relayed as whatever it says it is.
func readAnswer(br *bufio.Reader, resp *fasthttp.Response, stream bool, maxBody int64, hold *AnswerHold) error {
	for interim := 0; ; interim++ {
		if err := resp.Header.Read(br); err != nil {
			return answerHeadErr(err)
		}
		st := resp.StatusCode()
		if st >= 200 {
			break
		}
		if st != fasthttp.StatusContinue || interim >= maxInterim {
			return fmt.Errorf("%w: status %d", ErrBadUpstreamAnswer, st)
		}
		resp.Header.Reset()
	}
	if stream {
		return nil
	}
	return readAnswerBody(br, resp, maxBody, hold)
}

// answerHeadErr names a failed read of an answer's head: the connection's
// failure (closed, reset, timed out) as it is, anything else (a head that
// does not parse, or is longer than the read buffer) as a bad answer.
func answerHeadErr(err error) error {
	var ne net.Error
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, fasthttp.ErrTimeout) ||
		errors.As(err, &ne) || isReset(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrBadUpstreamAnswer, err)
}

// readAnswerBody reads resp's body whole from br, decoded as the lane and
// a Leg decode it (httpbody), and refuses it past maxBody bytes before
// reading them: a declared length up front, a chunked or close-delimited
// body as it grows. The body's bytes are reserved in hold (nil:
// unbounded) before they are kept (see AnswerHold); a body the budget
// refuses fails with ErrBufferBudget, and what hold reserved stays there
// for the caller to release. A body delimited by the connection's close
// marks resp Connection: close (the connection is not pooled).
func readAnswerBody(br *bufio.Reader, resp *fasthttp.Response, maxBody int64, hold *AnswerHold) error {
	resp.ResetBody()
	if hold == nil {
		hold = &AnswerHold{}
	}
	dec := bodyDecoder(resp)
	if cl := resp.Header.ContentLength(); !dec.Done() && cl > 0 {
		if int64(cl) > maxBody {
			return fmt.Errorf("%w (Content-Length %d)", ErrAnswerTooLarge, cl)
		}
		if err := hold.cover(int64(cl), int64(cl)); err != nil {
			return err
		}
	}
	for !dec.Done() {
		if br.Buffered() == 0 {
			if _, err := br.Peek(1); err != nil {
				if errors.Is(err, io.EOF) {
					if dec.Mode() == httpbody.UntilClose {
						resp.SetConnectionClose()
						return nil
					}
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
		in, _ := br.Peek(br.Buffered())
		data, n, err := dec.Next(in, len(in))
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBadUpstreamAnswer, err)
		}
		size := int64(len(resp.Body()) + len(data))
		if size > maxBody {
			return ErrAnswerTooLarge
		}
		if err := hold.cover(size, maxBody); err != nil {
			return err
		}
		resp.AppendBody(data)
		_, _ = br.Discard(n)
	}
	return nil
}

// bodyDecoder returns the framing decoder of resp's body.
func bodyDecoder(resp *fasthttp.Response) httpbody.Decoder {
	if resp.SkipBody {
		return httpbody.New(httpbody.Length, 0)
	}
	return headDecoder(&resp.Header)
}

// bodiless reports whether an answer of status st has no body, whatever
// its head says (a 1xx never reaches a client: readAnswer refuses it).
func bodiless(st int) bool {
	return st < 200 || st == fasthttp.StatusNoContent || st == fasthttp.StatusNotModified
}

// headDecoder returns the framing decoder of the body of the answer with
// head h.
func headDecoder(h *fasthttp.ResponseHeader) httpbody.Decoder {
	if bodiless(h.StatusCode()) {
		return httpbody.New(httpbody.Length, 0)
	}
	switch cl := h.ContentLength(); {
	case cl >= 0:
		return httpbody.New(httpbody.Length, int64(cl))
	case cl == -1:
		return httpbody.New(httpbody.Chunked, 0)
	default:
		return httpbody.New(httpbody.UntilClose, 0)
	}
}

// ctxErr prefers the context's cause when the context ended the leg.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", context.Cause(ctx), err)
	}
	return err
}

// Leg is the streamed body of one upstream response. It is read and closed
// by one goroutine (Close must not race a Read); cancelling its context from
// any goroutine interrupts a pending Read.
type Leg struct {
	ctx        context.Context
	br         *bufio.Reader // the connection's reader
	conn       net.Conn
	body       httpbody.Decoder
	declared   int                 // the answer's Content-Length (negative: none)
	putReader  func(*bufio.Reader) // gives br back to its pool
	release    func(clean bool)    // gives the connection back, or closes it
	stopCancel func() bool         // disarms the context's close-the-connection hook
	eof        bool
	closed     bool
	budget     BufferBudget // what a body read whole draws from (nil: unbounded)

	// firstByte, while not zero, is the first-byte timeout still bounding
	// reads (StreamFirstByteTimeout), until Began restores deadline.
	firstByte time.Duration
	deadline  time.Time
}

// Began ends the first-byte bound of the leg: the answer began.
func (l *Leg) Began() {
	if l.firstByte == 0 || l.closed {
		return
	}
	l.firstByte = 0
	_ = l.conn.SetDeadline(l.deadline) // a failure fails the next read
}

// ahead returns the raw bytes already received on the connection and not
// yet read through the body (chunk framing included). It never blocks.
func (l *Leg) ahead() []byte {
	if l.closed || l.br == nil {
		return nil
	}
	b, _ := l.br.Peek(l.br.Buffered())
	return b
}

// Read reads the response body.
func (l *Leg) Read(p []byte) (int, error) {
	if l.closed {
		return 0, io.ErrClosedPipe
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if l.eof {
			return 0, io.EOF
		}
		if l.br.Buffered() == 0 {
			if _, err := l.br.Peek(1); err != nil {
				if errors.Is(err, io.EOF) {
					if l.body.Mode() == httpbody.UntilClose {
						l.eof = true
						return 0, io.EOF
					}
					err = io.ErrUnexpectedEOF
				}
				if l.firstByte > 0 && l.ctx.Err() == nil && isTimeout(err) {
					err = fmt.Errorf("%w after %v: %w", ErrFirstByteTimeout, l.firstByte, err)
				}
				return 0, ctxErr(l.ctx, err)
			}
		}
		in, _ := l.br.Peek(l.br.Buffered())
		data, n, err := l.body.Next(in, len(p))
		copy(p, data)
		_, _ = l.br.Discard(n)
		l.eof = l.body.Done()
		if err != nil {
			return 0, err
		}
		if len(data) > 0 {
			return len(data), nil
		}
	}
}

// readAll reads the whole body, refusing one longer than maxBody bytes
// (ErrAnswerTooLarge) before reading it when its length is declared, as it
// grows otherwise. The buffer holding it is reserved from the leg's budget
// before it is allocated (see AnswerHold; refused: ErrBufferBudget), and
// the caller releases the hold once it lets go of the bytes. On failure
// nothing is held.
func (l *Leg) readAll(maxBody int64) (b []byte, hold AnswerHold, err error) {
	hold.b = l.budget
	size := int64(512) // the buffer's first size, as io.ReadAll's
	if !l.eof && l.body.Mode() == httpbody.Length {
		if int64(l.declared) > maxBody {
			return nil, AnswerHold{}, fmt.Errorf("%w (Content-Length %d)", ErrAnswerTooLarge, l.declared)
		}
		size = int64(l.declared)
		if err := hold.cover(size, size); err != nil {
			return nil, AnswerHold{}, err
		}
	}
	// A body of maxBody bytes, and a byte more that shows it too long.
	limit := maxBody + 1
	b = make([]byte, 0, min(size, limit))
	for {
		if l.eof {
			return b, hold, nil // a declared length's end, past which nothing is read
		}
		if len(b) == cap(b) {
			if int64(len(b)) >= limit {
				hold.Release()
				return nil, AnswerHold{}, ErrAnswerTooLarge
			}
			grown := min(max(2*int64(cap(b)), 512), limit)
			if err := hold.cover(grown, limit); err != nil {
				hold.Release()
				return nil, AnswerHold{}, err
			}
			b = append(make([]byte, 0, grown), b...)
		}
		n, err := l.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			if int64(len(b)) > maxBody {
				hold.Release()
				return nil, AnswerHold{}, ErrAnswerTooLarge
			}
			return b, hold, nil
		}
		if err != nil {
			hold.Release()
			return nil, AnswerHold{}, err
		}
	}
}

// Close ends the leg. The connection goes back to the pool only when the
// body was read to its end; otherwise it is closed, so the engine sees the
// request abandoned.
func (l *Leg) Close() {
	if l.closed {
		return
	}
	l.closed = true
	// Bytes after the body are no answer to anything sent: the connection
	// is not pooled.
	clean := l.eof && l.body.Mode() != httpbody.UntilClose && (l.br == nil || l.br.Buffered() == 0)
	l.dropReader()
	l.release(clean)
}

// disarm makes sure nothing but Close will close the connection: it stops
// the hook that closes it when the leg's context ends, and reports whether
// that hook had not run (when it had, the connection is closed or closing).
func (l *Leg) disarm() bool { return l.stopCancel() }

// dropReader gives the connection's read buffer back; the bytes it held
// must have been taken (ahead) before.
func (l *Leg) dropReader() {
	if l.br != nil {
		l.putReader(l.br)
		l.br = nil
	}
}
