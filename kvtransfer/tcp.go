package kvtransfer

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// TCPConfig configures the tcp transport. Zero fields take the defaults
// noted.
type TCPConfig struct {
	// MaxIdleConns is how many idle connections are kept per agent for
	// reuse (default 8). A pull opens up to PullerConfig.Streams at once.
	MaxIdleConns int
	// DialTimeout bounds each connect (default 2 s).
	DialTimeout time.Duration
	// GrantExtra, when set, fills Grant.Extra on the agent side for every
	// Open (transports that use tcp as their control channel, e.g. ucx).
	GrantExtra func(g *Grant) error
	// Info, when set, answers a puller's Info call on the agent side: what
	// a transport riding on this control channel needs before any hold
	// (for ucx: the worker address and the probe region).
	Info func() ([]byte, error)
}

// TCPTransport is the pure-Go transport: block bytes are written from the
// agent's region with writev and read by the puller straight into the
// destination blocks. Create it with NewTCPTransport.
type TCPTransport struct {
	cfg TCPConfig
}

// NewTCPTransport returns a tcp transport.
func NewTCPTransport(cfg TCPConfig) *TCPTransport {
	if cfg.MaxIdleConns <= 0 {
		cfg.MaxIdleConns = 8
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	return &TCPTransport{cfg: cfg}
}

// Name returns "tcp".
func (*TCPTransport) Name() string { return "tcp" }

// Listen serves a on a TCP listener at addr.
func (t *TCPTransport) Listen(ctx context.Context, addr string, a *Agent) (Listener, error) {
	var lc net.ListenConfig
	nl, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("kvtransfer tcp listen %s: %w", addr, err)
	}
	l := &tcpListener{l: nl, a: a, extra: t.cfg.GrantExtra, info: t.cfg.Info, conns: map[net.Conn]struct{}{}}
	ctx, l.cancel = context.WithCancel(ctx)
	go l.accept(ctx)
	return l, nil
}

type tcpListener struct {
	l      net.Listener
	a      *Agent
	extra  func(*Grant) error
	info   func() ([]byte, error)
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func (l *tcpListener) Addr() string { return l.l.Addr().String() }

// Close stops accepting and breaks every open connection.
func (l *tcpListener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	l.cancel()
	err := l.l.Close()
	for c := range conns {
		_ = c.Close()
	}
	return err
}

func (l *tcpListener) accept(ctx context.Context) {
	context.AfterFunc(ctx, func() { _ = l.Close() })
	for {
		c, err := l.l.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			return
		}
		l.conns[c] = struct{}{}
		l.mu.Unlock()
		go func() {
			l.serve(ctx, c)
			l.mu.Lock()
			delete(l.conns, c)
			l.mu.Unlock()
			_ = c.Close()
		}()
	}
}

// serve answers request frames on one connection until it breaks.
func (l *tcpListener) serve(ctx context.Context, c net.Conn) {
	r := bufio.NewReaderSize(c, 16<<10)
	for {
		op, payload, err := readFrame(r)
		if err != nil {
			return
		}
		if err := l.handle(ctx, c, op, payload); err != nil {
			return
		}
	}
}

// handle answers one request; an error means the connection is unusable.
func (l *tcpListener) handle(ctx context.Context, c net.Conn, op byte, payload []byte) error {
	fail := func(err error) error { return writeFrame(c, statusOf(err), []byte(err.Error())) }
	switch op {
	case opOpen:
		var req OpenRequest
		if err := json.Unmarshal(payload, &req); err != nil {
			return fail(fmt.Errorf("bad open: %w: %w", err, ErrKVProtocol))
		}
		g, err := l.a.Open(req)
		if err == nil && l.extra != nil {
			err = l.extra(&g)
		}
		if err != nil {
			return fail(err)
		}
		return writeJSONFrame(c, stOK, g)
	case opRead:
		var req readReq
		if err := json.Unmarshal(payload, &req); err != nil {
			return fail(fmt.Errorf("bad read: %w: %w", err, ErrKVProtocol))
		}
		return l.read(ctx, c, req)
	case opComplete, opRelease:
		var req releaseReq
		if err := json.Unmarshal(payload, &req); err != nil {
			return fail(fmt.Errorf("bad release: %w: %w", err, ErrKVProtocol))
		}
		if op == opRelease {
			l.a.Release(req.RequestID)
		} else if err := l.a.Complete(req.RequestID); err != nil {
			return fail(err)
		}
		return writeFrame(c, stOK, nil)
	case opProbe:
		var req probeReq
		if err := json.Unmarshal(payload, &req); err != nil || req.Size < 0 || req.Size > maxProbe {
			return fail(fmt.Errorf("bad probe: %w", ErrKVProtocol))
		}
		return sendFiller(c, req.Size)
	case opInfo:
		if l.info == nil {
			return fail(fmt.Errorf("this agent has no transport info: %w", ErrKVProtocol))
		}
		b, err := l.info()
		if err != nil {
			return fail(err)
		}
		return writeFrame(c, stOK, b)
	}
	return fail(fmt.Errorf("unknown op %d: %w", op, ErrKVProtocol))
}

// read sends the requested blocks: the length, then the bytes, written with
// writev from the region (paced to the agent's bandwidth when set).
func (l *tcpListener) read(ctx context.Context, c net.Conn, req readReq) error {
	blocks, done, err := l.a.Acquire(req.RequestID, req.Idx)
	if err != nil {
		return writeFrame(c, statusOf(err), []byte(err.Error()))
	}
	defer done()
	var total int64
	for _, b := range blocks {
		total += int64(len(b))
	}
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(total))
	if err := writeFrame(c, stOK, n[:]); err != nil {
		return err
	}
	if l.a.Bandwidth() <= 0 {
		bufs := net.Buffers(blocks)
		_, err := bufs.WriteTo(c)
		return err
	}
	start := time.Now()
	var sent int64
	const chunk = 16 << 10
	for _, b := range blocks {
		for off := 0; off < len(b); off += chunk {
			m, err := c.Write(b[off:min(off+chunk, len(b))])
			if err != nil {
				return err
			}
			sent += int64(m)
			if err := pace(ctx, l.a.Bandwidth(), start, sent); err != nil {
				return err
			}
		}
	}
	return nil
}

var zeros = make([]byte, 64<<10)

func sendFiller(c net.Conn, size int64) error {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(size))
	if err := writeFrame(c, stOK, n[:]); err != nil {
		return err
	}
	for size > 0 {
		m, err := c.Write(zeros[:min(size, int64(len(zeros)))])
		if err != nil {
			return err
		}
		size -= int64(m)
	}
	return nil
}

// Dial returns a pooled connection set to the agent at addr. It connects
// once to check the agent is there (wrapping ErrKVSourceGone if not) and
// keeps that connection for reuse.
func (t *TCPTransport) Dial(ctx context.Context, addr string) (Conn, error) {
	c := &tcpConn{addr: addr, cfg: t.cfg}
	nc, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.put(nc)
	return c, nil
}

// tcpConn is a pool of connections to one agent.
type tcpConn struct {
	addr string
	cfg  TCPConfig

	mu     sync.Mutex
	idle   []net.Conn
	closed bool
}

func (c *tcpConn) dial(ctx context.Context) (net.Conn, error) {
	d := net.Dialer{Timeout: c.cfg.DialTimeout}
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("dial agent %s: %w", c.addr, ctx.Err())
		}
		return nil, fmt.Errorf("dial agent %s: %w: %w", c.addr, ErrKVSourceGone, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return nc, nil
}

// get returns an idle connection (reused reports so) or a new one.
func (c *tcpConn) get(ctx context.Context) (nc net.Conn, reused bool, err error) {
	c.mu.Lock()
	if n := len(c.idle); n > 0 {
		nc = c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return nc, true, nil
	}
	c.mu.Unlock()
	nc, err = c.dial(ctx)
	return nc, false, err
}

func (c *tcpConn) put(nc net.Conn) {
	c.mu.Lock()
	if !c.closed && len(c.idle) < c.cfg.MaxIdleConns {
		c.idle = append(c.idle, nc)
		nc = nil
	}
	c.mu.Unlock()
	if nc != nil {
		_ = nc.Close()
	}
}

// exchange runs fn on one pooled connection under ctx: ctx's deadline and
// cancellation interrupt blocked I/O. The connection returns to the pool
// only when fn succeeded or failed with an agent-side error (the stream is
// still in sync). A reused connection that breaks before any answer is
// retried once on a fresh one when retry is set (idempotent operations).
func (c *tcpConn) exchange(ctx context.Context, retry bool, fn func(nc net.Conn) error) error {
	for attempt := 0; ; attempt++ {
		nc, reused, err := c.get(ctx)
		if err != nil {
			return err
		}
		err = c.run(ctx, nc, fn)
		var ae *agentError
		switch {
		case err == nil || errors.As(err, &ae):
			c.put(nc)
			if ae != nil {
				return ae.err
			}
			return nil
		case ended(ctx):
			_ = nc.Close()
			cause := ctx.Err()
			if cause == nil {
				cause = context.DeadlineExceeded
			}
			return fmt.Errorf("agent %s: %w (%v)", c.addr, cause, err)
		}
		_ = nc.Close()
		if !(retry && reused && attempt == 0) {
			if errors.Is(err, ErrKVProtocol) || errors.Is(err, ErrKVSize) {
				return err
			}
			return fmt.Errorf("agent %s: %w: %w", c.addr, ErrKVSourceGone, err)
		}
	}
}

func (c *tcpConn) run(ctx context.Context, nc net.Conn, fn func(nc net.Conn) error) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	err := fn(nc)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	_ = nc.SetDeadline(time.Time{})
	return err
}

// agentError is an error the agent answered; the connection stays usable.
type agentError struct{ err error }

func (e *agentError) Error() string { return e.err.Error() }

// call sends a request frame and reads the response frame's payload.
func call(nc net.Conn, op byte, req any) ([]byte, error) {
	if err := writeJSONFrame(nc, op, req); err != nil {
		return nil, err
	}
	st, payload, err := readFrame(nc)
	if err != nil {
		return nil, err
	}
	if st != stOK {
		return nil, &agentError{errOf(st, payload)}
	}
	return payload, nil
}

// Open asks the agent for the hold's grant.
func (c *tcpConn) Open(ctx context.Context, req OpenRequest) (Grant, error) {
	var g Grant
	err := c.exchange(ctx, true, func(nc net.Conn) error {
		b, err := call(nc, opOpen, req)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &g); err != nil {
			return &agentError{fmt.Errorf("bad grant: %w: %w", err, ErrKVProtocol)}
		}
		return nil
	})
	return g, err
}

// Read reads the blocks straight into dst on one pooled connection.
func (c *tcpConn) Read(ctx context.Context, g Grant, idx []int, dst [][]byte) error {
	if len(idx) != len(dst) {
		return fmt.Errorf("%d indices for %d destinations: %w", len(idx), len(dst), ErrKVSize)
	}
	var want int64
	for _, d := range dst {
		if len(d) != g.BlockBytes {
			return fmt.Errorf("destination of %d bytes for %d-byte blocks: %w", len(d), g.BlockBytes, ErrKVSize)
		}
		want += int64(len(d))
	}
	return c.exchange(ctx, false, func(nc net.Conn) error {
		b, err := call(nc, opRead, readReq{RequestID: g.RequestID, Idx: idx})
		if err != nil {
			return err
		}
		if len(b) != 8 || int64(binary.BigEndian.Uint64(b)) != want {
			return fmt.Errorf("read of %d bytes answered with %x: %w", want, b, ErrKVSize)
		}
		for _, d := range dst {
			if _, err := io.ReadFull(nc, d); err != nil {
				return err
			}
		}
		return nil
	})
}

// Complete releases the hold after a successful pull.
func (c *tcpConn) Complete(ctx context.Context, g Grant) error {
	return c.exchange(ctx, false, func(nc net.Conn) error {
		_, err := call(nc, opComplete, releaseReq{RequestID: g.RequestID})
		return err
	})
}

// Release gives the hold up.
func (c *tcpConn) Release(ctx context.Context, requestID string) error {
	return c.exchange(ctx, true, func(nc net.Conn) error {
		_, err := call(nc, opRelease, releaseReq{RequestID: requestID})
		return err
	})
}

// Probe reads filler into every block of dst, in one exchange (none: a
// bare round trip).
func (c *tcpConn) Probe(ctx context.Context, dst [][]byte) error {
	var want int64
	for _, d := range dst {
		want += int64(len(d))
	}
	return c.exchange(ctx, false, func(nc net.Conn) error {
		b, err := call(nc, opProbe, probeReq{Size: want})
		if err != nil {
			return err
		}
		if len(b) != 8 || int64(binary.BigEndian.Uint64(b)) != want {
			return fmt.Errorf("probe answered with %x: %w", b, ErrKVProtocol)
		}
		for _, d := range dst {
			if _, err := io.ReadFull(nc, d); err != nil {
				return err
			}
		}
		return nil
	})
}

// Info returns the agent's transport info (TCPConfig.Info on its side).
func (c *tcpConn) Info(ctx context.Context) ([]byte, error) {
	var out []byte
	err := c.exchange(ctx, true, func(nc net.Conn) error {
		b, err := call(nc, opInfo, struct{}{})
		out = b
		return err
	})
	return out, err
}

// Close closes the idle connections; busy ones close when their call ends.
func (c *tcpConn) Close() error {
	c.mu.Lock()
	idle := c.idle
	c.idle, c.closed = nil, true
	c.mu.Unlock()
	for _, nc := range idle {
		_ = nc.Close()
	}
	return nil
}

var (
	_ Transport = (*TCPTransport)(nil)
	_ Listener  = (*tcpListener)(nil)
	_ Conn      = (*tcpConn)(nil)
	_ Prober    = (*tcpConn)(nil)
)
