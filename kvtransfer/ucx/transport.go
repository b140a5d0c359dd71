//go:build ucx

package ucx

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// Transport is the ucx transport: control (open, complete, release) over
// kvtransfer's tcp protocol, data by one-sided ucp_get_nbx from the agent's
// ucp_mem_map'ed regions. The agent's UCP listener address, the region base
// address and the packed remote key travel in Grant.Extra. UCX reads its
// own UCX_* environment (UCX_TLS, UCX_NET_DEVICES...).
type Transport struct {
	mu sync.Mutex
	wk *worker // the pullers' worker, created on first Dial
}

// New returns the ucx transport.
func New() (*Transport, error) { return &Transport{}, nil }

// Name returns "ucx".
func (*Transport) Name() string { return "ucx" }

// extra is Grant.Extra of the ucx transport.
type extra struct {
	Host string `json:"host"`
	Port int    `json:"port"`
	// Base is the remote address of the hold's region.
	Base uint64 `json:"base"`
	// RKey is the region's packed remote key.
	RKey []byte `json:"rkey"`
	// Pace is the agent's bandwidth cap (bytes/s, 0: none): one-sided
	// reads cannot be paced by the agent, so the puller honours it (the
	// simulator's timing model).
	Pace float64 `json:"pace,omitempty"`
}

// Listen maps every region of a, opens a UCP listener on addr's host and
// serves the control protocol on addr.
func (t *Transport) Listen(ctx context.Context, addr string, a *kvtransfer.Agent) (kvtransfer.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("ucx listen %s: %w", addr, err)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	wk, err := newWorker()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", kvtransfer.ErrUnsupported, err)
	}
	l := &ucxListener{wk: wk, regs: map[*kvtransfer.Region]*memReg{}}
	for _, r := range a.Regions() {
		m, err := wk.memMap(r.Mem())
		if err != nil {
			l.Close()
			return nil, err
		}
		l.regs[r] = m
	}
	if l.ul, err = wk.listen(host); err != nil {
		l.Close()
		return nil, err
	}
	tcp := kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{GrantExtra: func(g *kvtransfer.Grant) error {
		r, err := a.Region(g.RequestID)
		if err != nil {
			return err
		}
		m, ok := l.regs[r]
		if !ok {
			return fmt.Errorf("region %s was registered after Listen: %w", r.Name(), kvtransfer.ErrKVProtocol)
		}
		g.Extra, err = json.Marshal(extra{Host: host, Port: l.ul.port, Base: uint64(m.base), RKey: m.rkey, Pace: a.Bandwidth()})
		return err
	}})
	if l.ctl, err = tcp.Listen(ctx, addr, a); err != nil {
		l.Close()
		return nil, err
	}
	context.AfterFunc(ctx, func() { _ = l.Close() })
	return l, nil
}

type ucxListener struct {
	wk   *worker
	ul   *listener
	ctl  kvtransfer.Listener
	regs map[*kvtransfer.Region]*memReg
	once sync.Once
}

func (l *ucxListener) Addr() string { return l.ctl.Addr() }

// Close stops the control listener, the UCP listener and the worker (which
// closes the accepted endpoints: pullers mid-read see an error).
func (l *ucxListener) Close() error {
	l.once.Do(func() {
		if l.ctl != nil {
			_ = l.ctl.Close()
		}
		if l.ul != nil {
			l.ul.close()
		}
		for _, m := range l.regs {
			l.wk.memUnmap(m)
		}
		l.wk.close()
	})
	return nil
}

// Dial connects the control channel; the UCP endpoint is created on the
// first Read, from the grant.
func (t *Transport) Dial(ctx context.Context, addr string) (kvtransfer.Conn, error) {
	t.mu.Lock()
	if t.wk == nil {
		wk, err := newWorker()
		if err != nil {
			t.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", kvtransfer.ErrUnsupported, err)
		}
		t.wk = wk
	}
	wk := t.wk
	t.mu.Unlock()
	ctl, err := kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{}).Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &ucxConn{Conn: ctl, wk: wk}, nil
}

// ucxConn is the control connection plus one UCP endpoint to the agent.
type ucxConn struct {
	kvtransfer.Conn // Open, Complete, Release over tcp
	wk              *worker
	mu              sync.Mutex
	ep              *endpoint
	epKey           string
}

func (c *ucxConn) endpoint(x extra) (*endpoint, error) {
	key := net.JoinHostPort(x.Host, strconv.Itoa(x.Port))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ep != nil && c.epKey == key && !c.ep.isBroken() {
		return c.ep, nil
	}
	if c.ep != nil {
		c.ep.close()
		c.ep = nil
	}
	ep, err := c.wk.connect(x.Host, x.Port)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", kvtransfer.ErrKVSourceGone, err)
	}
	c.ep, c.epKey = ep, key
	return ep, nil
}

// Read gets the blocks one-sided straight into dst, in chunks paced to the
// agent's cap when it has one.
func (c *ucxConn) Read(ctx context.Context, g kvtransfer.Grant, idx []int, dst [][]byte) error {
	var x extra
	if err := json.Unmarshal(g.Extra, &x); err != nil || len(x.RKey) == 0 {
		return fmt.Errorf("ucx grant without a remote key: %w", kvtransfer.ErrKVProtocol)
	}
	if len(idx) != len(dst) {
		return fmt.Errorf("%d indices for %d destinations: %w", len(idx), len(dst), kvtransfer.ErrKVSize)
	}
	ops := make([]getOp, len(idx))
	for k, i := range idx {
		if i < 0 || i >= len(g.BlockIDs) || len(dst[k]) != g.BlockBytes {
			return fmt.Errorf("block %d of %d bytes into %d: %w", i, g.BlockBytes, len(dst[k]), kvtransfer.ErrKVSize)
		}
		ops[k] = getOp{dst: dst[k], raddr: x.Base + uint64(g.BlockIDs[i])*uint64(g.BlockBytes)}
	}
	ep, err := c.endpoint(x)
	if err != nil {
		return err
	}
	cancelled := func() bool { return ctx.Err() != nil }
	batch := len(ops)
	if x.Pace > 0 {
		batch = max(1, int(16<<10/g.BlockBytes))
	}
	start := time.Now()
	var sent int64
	for lo := 0; lo < len(ops); lo += batch {
		hi := min(lo+batch, len(ops))
		if err := ep.get(x.RKey, ops[lo:hi], cancelled); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("ucx get: %w", ctx.Err())
			}
			return fmt.Errorf("ucx get from %s:%d: %w: %w", x.Host, x.Port, kvtransfer.ErrKVSourceGone, err)
		}
		sent += int64(hi-lo) * int64(g.BlockBytes)
		if x.Pace > 0 {
			due := time.Duration(float64(sent) / x.Pace * float64(time.Second))
			if wait := due - time.Since(start); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return fmt.Errorf("ucx get: %w", ctx.Err())
				}
			}
		}
	}
	return nil
}

// Close closes the endpoint and the control connection.
func (c *ucxConn) Close() error {
	c.mu.Lock()
	if c.ep != nil {
		c.ep.close()
		c.ep = nil
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

func (e *endpoint) isBroken() bool {
	e.wk.mu.Lock()
	defer e.wk.mu.Unlock()
	return e.broken
}

var (
	_ kvtransfer.Transport = (*Transport)(nil)
	_ kvtransfer.Listener  = (*ucxListener)(nil)
	_ kvtransfer.Conn      = (*ucxConn)(nil)
)
