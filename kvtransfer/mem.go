package kvtransfer

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// MemTransport is an in-process Transport: agents listen on names in one
// MemTransport and pullers of the same MemTransport reach them by calling
// the Agent directly, copying bytes. It wires many agents and pullers in one
// test without sockets. Create it with NewMemTransport.
type MemTransport struct {
	mu     sync.Mutex
	agents map[string]*memListener
	next   int
}

// NewMemTransport returns an empty in-memory network.
func NewMemTransport() *MemTransport {
	return &MemTransport{agents: map[string]*memListener{}}
}

// Name returns "mem".
func (*MemTransport) Name() string { return "mem" }

// Listen registers a under addr (":0" or "" picks a fresh name).
func (m *MemTransport) Listen(ctx context.Context, addr string, a *Agent) (Listener, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if addr == "" || addr == ":0" {
		m.next++
		addr = "mem-" + strconv.Itoa(m.next) + ":1"
	}
	if _, ok := m.agents[addr]; ok {
		return nil, fmt.Errorf("mem listen %s: address in use", addr)
	}
	l := &memListener{m: m, addr: addr, a: a}
	m.agents[addr] = l
	context.AfterFunc(ctx, func() { _ = l.Close() })
	return l, nil
}

// Dial returns a connection to the agent at addr, failing with
// ErrKVSourceGone when none listens there.
func (m *MemTransport) Dial(_ context.Context, addr string) (Conn, error) {
	if _, err := m.agent(addr); err != nil {
		return nil, err
	}
	return &memConn{m: m, addr: addr}, nil
}

func (m *MemTransport) agent(addr string) (*Agent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.agents[addr]
	if !ok {
		return nil, fmt.Errorf("mem %s: no agent listening: %w", addr, ErrKVSourceGone)
	}
	return l.a, nil
}

type memListener struct {
	m    *MemTransport
	addr string
	a    *Agent
}

func (l *memListener) Addr() string { return l.addr }

func (l *memListener) Close() error {
	l.m.mu.Lock()
	if l.m.agents[l.addr] == l {
		delete(l.m.agents, l.addr)
	}
	l.m.mu.Unlock()
	return nil
}

type memConn struct {
	m    *MemTransport
	addr string
}

func (c *memConn) Open(ctx context.Context, req OpenRequest) (Grant, error) {
	if err := ctx.Err(); err != nil {
		return Grant{}, err
	}
	a, err := c.m.agent(c.addr)
	if err != nil {
		return Grant{}, err
	}
	return a.Open(req)
}

// Read copies block by block, pacing to the agent's bandwidth and checking
// after each block that the agent is still listening and ctx still live.
func (c *memConn) Read(ctx context.Context, g Grant, idx []int, dst [][]byte) error {
	a, err := c.m.agent(c.addr)
	if err != nil {
		return err
	}
	blocks, done, err := a.Acquire(g.RequestID, idx)
	if err != nil {
		return err
	}
	defer done()
	start := time.Now()
	var sent int64
	for k, b := range blocks {
		if len(dst[k]) != len(b) {
			return fmt.Errorf("destination %d is %d bytes, block %d: %w", k, len(dst[k]), len(b), ErrKVSize)
		}
		copy(dst[k], b)
		sent += int64(len(b))
		if err := pace(ctx, a.Bandwidth(), start, sent); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := c.m.agent(c.addr); err != nil {
			return err
		}
	}
	return nil
}

func (c *memConn) Complete(ctx context.Context, g Grant) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	a, err := c.m.agent(c.addr)
	if err != nil {
		return err
	}
	return a.Complete(g.RequestID)
}

func (c *memConn) Release(_ context.Context, requestID string) error {
	a, err := c.m.agent(c.addr)
	if err != nil {
		return err
	}
	a.Release(requestID)
	return nil
}

func (c *memConn) Close() error { return nil }

var (
	_ Transport = (*MemTransport)(nil)
	_ Listener  = (*memListener)(nil)
	_ Conn      = (*memConn)(nil)
)
