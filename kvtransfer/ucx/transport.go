//go:build ucx

package ucx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// Transport is the ucx transport: control (open, complete, release) over
// kvtransfer's tcp protocol, data by one-sided ucp_get_nbx from the agent's
// ucp_mem_map'ed regions. The agent's UCP worker address, the region's
// base address and its packed remote key travel in Grant.Extra; the puller
// creates its endpoint from the worker address, so any transport the two
// workers share carries the gets (shared memory and cma on one host, tcp,
// rc/dc verbs). UCX reads its own UCX_* environment (UCX_TLS,
// UCX_NET_DEVICES...).
type Transport struct {
	mu sync.Mutex
	wk *worker // the pullers' worker, created on first Dial
	// local is the pullers' worker limited to sysv and posix shared memory
	// (see localTLS), created on first Dial when the setting allows them;
	// nil otherwise. Endpoints try it first: it reaches agents on this
	// host only.
	local *worker
}

// New returns the ucx transport.
func New() (*Transport, error) { return &Transport{}, nil }

// Name returns "ucx".
func (*Transport) Name() string { return "ucx" }

// agentInfo is the agent's answer to an Info call: the probe regions.
type agentInfo struct {
	// Plain is filler in memory the agent allocated itself, as an engine
	// allocates its KV: what a pull reads.
	Plain extra `json:"plain"`
	// UCX is filler in memory UCX allocated (ucp_mem_map with
	// UCP_MEM_MAP_ALLOCATE), as ucx_perftest's buffers are: on one host
	// UCX can map it into the reader, which memory it did not allocate
	// it cannot (without xpmem).
	UCX extra `json:"ucx"`
}

// extra is Grant.Extra of the ucx transport, and one probe region of an
// Info answer.
type extra struct {
	// Worker is the agent's UCP worker address.
	Worker []byte `json:"worker"`
	// Base is the remote address of the hold's region (of the probe
	// region in an Info answer).
	Base uint64 `json:"base"`
	// RKey is the region's packed remote key.
	RKey []byte `json:"rkey"`
	// Size is the probe region's size (Info answers only).
	Size int `json:"size,omitempty"`
	// Pace is the agent's bandwidth cap (bytes/s, 0: none): one-sided
	// reads cannot be paced by the agent, so the puller honours it (the
	// simulator's timing model).
	Pace float64 `json:"pace,omitempty"`
}

// probeBytes is the size of the filler region every agent serves to
// kv-probe (the largest block size it measures).
const probeBytes = 4 << 20

// In flight per pull: at most maxInFlight gets and about
// maxInFlightBytes. Enough to keep a NIC or the tcp transport's software
// RMA busy; bounded so one pull of a long prompt cannot queue thousands of
// requests on the worker ahead of the others.
const (
	maxInFlight      = 64
	maxInFlightBytes = 16 << 20
)

// window is how many gets of blockBytes each may be in flight.
func window(blockBytes int) int {
	return max(2, min(maxInFlight, maxInFlightBytes/max(1, blockBytes)))
}

// Listen maps every region of a and a filler region for probes, and serves
// the control protocol on addr. Pullers reach the agent's worker at the
// address its grants carry.
func (t *Transport) Listen(ctx context.Context, addr string, a *kvtransfer.Agent) (kvtransfer.Listener, error) {
	wk, err := newWorker("")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", kvtransfer.ErrUnsupported, err)
	}
	l := &ucxListener{wk: wk, regs: map[*kvtransfer.Region]*memReg{}, probe: newProbeRegion(probeBytes)}
	for _, r := range a.Regions() {
		mem := r.Mem()
		if len(mem) == 0 {
			l.Close()
			return nil, fmt.Errorf("ucx listen: region %s is empty: %w", r.Name(), kvtransfer.ErrKVSize)
		}
		m, err := wk.memMap(uintptr(unsafe.Pointer(&mem[0])), len(mem))
		if err != nil {
			l.Close()
			return nil, err
		}
		l.regs[r] = m
	}
	if l.probeReg, err = wk.memMap(uintptr(l.probe.mem), l.probe.size); err != nil {
		l.Close()
		return nil, err
	}
	if l.allocReg, err = wk.memAlloc(probeBytes); err != nil {
		l.Close()
		return nil, err
	}
	info, err := json.Marshal(agentInfo{
		Plain: extra{Worker: wk.addr, Base: uint64(l.probeReg.base), RKey: l.probeReg.rkey, Size: l.probe.size},
		UCX:   extra{Worker: wk.addr, Base: uint64(l.allocReg.base), RKey: l.allocReg.rkey, Size: probeBytes},
	})
	if err != nil {
		l.Close()
		return nil, err
	}
	tcp := kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{
		GrantExtra: func(g *kvtransfer.Grant) error {
			r, err := a.Region(g.RequestID)
			if err != nil {
				return err
			}
			m, ok := l.regs[r]
			if !ok {
				return fmt.Errorf("region %s was registered after Listen: %w", r.Name(), kvtransfer.ErrKVProtocol)
			}
			g.Extra, err = json.Marshal(extra{Worker: wk.addr, Base: uint64(m.base), RKey: m.rkey, Pace: a.Bandwidth()})
			return err
		},
		Info: func() ([]byte, error) { return info, nil },
	})
	if l.ctl, err = tcp.Listen(ctx, addr, a); err != nil {
		l.Close()
		return nil, err
	}
	context.AfterFunc(ctx, func() { _ = l.Close() })
	return l, nil
}

type ucxListener struct {
	wk       *worker
	ctl      kvtransfer.Listener
	regs     map[*kvtransfer.Region]*memReg
	probe    *probeRegion
	probeReg *memReg
	allocReg *memReg // UCX-allocated probe region
	once     sync.Once
}

func (l *ucxListener) Addr() string { return l.ctl.Addr() }

// Close stops the control listener and the worker: pullers' endpoints to
// it fail (where the transport detects a peer's failure) and their next
// control call finds the agent gone.
func (l *ucxListener) Close() error {
	l.once.Do(func() {
		if l.ctl != nil {
			_ = l.ctl.Close()
		}
		for _, m := range l.regs {
			l.wk.memUnmap(m)
		}
		if l.probeReg != nil {
			l.wk.memUnmap(l.probeReg)
		}
		if l.allocReg != nil {
			l.wk.memUnmap(l.allocReg) // frees UCX's allocation
		}
		l.wk.close()
		l.probe.free()
	})
	return nil
}

// Dial connects the control channel; the UCP endpoint is created on the
// first Read or Probe, from the agent's worker address.
func (t *Transport) Dial(ctx context.Context, addr string) (kvtransfer.Conn, error) {
	t.mu.Lock()
	if t.wk == nil {
		wk, err := newWorker("")
		if err != nil {
			t.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", kvtransfer.ErrUnsupported, err)
		}
		t.wk = wk
		if tls := localTLS(configuredTLS()); tls != "" {
			// Without it the gets to an agent on this host ride tcp (or
			// find no transport); if it cannot be made, they still can.
			t.local, _ = newWorker(tls)
		}
	}
	wk, local := t.wk, t.local
	t.mu.Unlock()
	ctl, err := kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{}).Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	ic, ok := ctl.(infoConn)
	if !ok {
		_ = ctl.Close()
		return nil, fmt.Errorf("ucx: the tcp control connection cannot ask for info: %w", kvtransfer.ErrUnsupported)
	}
	return &ucxConn{Conn: ctl, info: ic, wk: wk, local: local}, nil
}

// infoConn is the control connection's Info call (kvtransfer's tcp Conn).
type infoConn interface {
	Info(ctx context.Context) ([]byte, error)
}

// ucxConn is the control connection plus one UCP endpoint to the agent's
// worker.
type ucxConn struct {
	kvtransfer.Conn // Open, Complete, Release over tcp
	info            infoConn
	wk              *worker
	local           *worker // shared-memory worker, or nil
	mu              sync.Mutex
	ep              *endpoint
	epKey           string     // the agent's worker address
	probe           *agentInfo // the agent's Info answer, once asked
}

func (c *ucxConn) endpoint(worker []byte) (*endpoint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ep != nil && c.epKey == string(worker) && !c.ep.isBroken() {
		return c.ep, nil
	}
	if c.ep != nil {
		c.ep.close()
		c.ep = nil
	}
	var ep *endpoint
	err := errUnreachable
	if c.local != nil {
		ep, err = c.local.connectLocal(worker)
	}
	if err != nil { // another host, or no transport in common: the main worker
		ep, err = c.wk.connect(worker)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", kvtransfer.ErrKVSourceGone, err)
	}
	c.ep, c.epKey = ep, string(worker)
	return ep, nil
}

// Read gets the blocks one-sided straight into dst, pipelined, paced to
// the agent's cap when it has one.
func (c *ucxConn) Read(ctx context.Context, g kvtransfer.Grant, idx []int, dst [][]byte) error {
	var x extra
	if err := json.Unmarshal(g.Extra, &x); err != nil || len(x.RKey) == 0 || len(x.Worker) == 0 {
		return fmt.Errorf("ucx grant without a worker address and remote key: %w", kvtransfer.ErrKVProtocol)
	}
	if len(idx) != len(dst) {
		return fmt.Errorf("%d indices for %d destinations: %w", len(idx), len(dst), kvtransfer.ErrKVSize)
	}
	ops := make([]getOp, len(idx))
	for k, i := range idx {
		if i < 0 || i >= len(g.BlockIDs) || len(dst[k]) != g.BlockBytes || g.BlockBytes <= 0 {
			return fmt.Errorf("block %d of %d bytes into %d: %w", i, g.BlockBytes, len(dst[k]), kvtransfer.ErrKVSize)
		}
		ops[k] = opInto(dst[k], x.Base+uint64(g.BlockIDs[i])*uint64(g.BlockBytes))
	}
	defer runtime.KeepAlive(dst)
	return c.gets(ctx, x, ops, g.BlockBytes)
}

// gets runs ops on the endpoint to x.Worker, in batches paced to x.Pace
// when set.
func (c *ucxConn) gets(ctx context.Context, x extra, ops []getOp, blockBytes int) error {
	ep, err := c.endpoint(x.Worker)
	if err != nil {
		return err
	}
	cancelled := func() bool { return ctx.Err() != nil }
	gone := func() bool { return false }
	if !ep.peerErr {
		// UCX does not watch the agent on these transports: the control
		// connection does, while the gets run.
		var stop func()
		gone, stop = c.watchAgent(ctx)
		defer stop()
	}
	batch := len(ops)
	if x.Pace > 0 {
		batch = max(1, int(16<<10/blockBytes))
	}
	start := time.Now()
	var sent int64
	for lo := 0; lo < len(ops); lo += batch {
		hi := min(lo+batch, len(ops))
		if err := ep.get(x.RKey, ops[lo:hi], window(blockBytes), cancelled, gone); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("ucx get: %w", ctx.Err())
			}
			return fmt.Errorf("ucx get: %w: %w", kvtransfer.ErrKVSourceGone, err)
		}
		sent += int64(hi-lo) * int64(blockBytes)
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

// livenessEvery is how often the control connection checks the agent while
// gets run on an endpoint without peer failure detection.
const livenessEvery = 100 * time.Millisecond

// watchAgent asks the agent for its info every livenessEvery until stop is
// called; gone reports whether one of those calls found the agent gone.
func (c *ucxConn) watchAgent(ctx context.Context) (gone func() bool, stop func()) {
	var dead atomic.Bool
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(livenessEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if _, err := c.info.Info(ctx); errors.Is(err, kvtransfer.ErrKVSourceGone) {
				dead.Store(true)
				return
			}
		}
	}()
	return dead.Load, func() { cancel(); <-done }
}

// probeInfo returns the agent's Info answer, asked once per connection.
func (c *ucxConn) probeInfo(ctx context.Context) (agentInfo, error) {
	c.mu.Lock()
	p := c.probe
	c.mu.Unlock()
	if p != nil {
		return *p, nil
	}
	b, err := c.info.Info(ctx)
	if err != nil {
		return agentInfo{}, err
	}
	var x agentInfo
	if err := json.Unmarshal(b, &x); err != nil || !x.Plain.probeable() || !x.UCX.probeable() {
		return agentInfo{}, fmt.Errorf("ucx agent info without a worker address and probe regions: %w", kvtransfer.ErrKVProtocol)
	}
	c.mu.Lock()
	c.probe = &x
	c.mu.Unlock()
	return x, nil
}

func (x extra) probeable() bool { return len(x.Worker) > 0 && len(x.RKey) > 0 && x.Size > 0 }

// Probe reads filler from the agent's plain probe region (memory it
// allocated, as engines allocate KV) into every block of dst, one get per
// block (blocks larger than the region in several), as Read does; with no
// blocks it makes one 64-byte get.
func (c *ucxConn) Probe(ctx context.Context, dst [][]byte) error {
	x, err := c.probeInfo(ctx)
	if err != nil {
		return err
	}
	return c.probeFrom(ctx, x.Plain, dst)
}

// ProbeUCXMemory is Probe from the region UCX allocated on the agent (the
// memory ucx_perftest measures): set beside Probe, it tells the cost of
// the memory's origin from the binding's.
func (c *ucxConn) ProbeUCXMemory(ctx context.Context, dst [][]byte) error {
	x, err := c.probeInfo(ctx)
	if err != nil {
		return err
	}
	return c.probeFrom(ctx, x.UCX, dst)
}

func (c *ucxConn) probeFrom(ctx context.Context, x extra, dst [][]byte) error {
	defer runtime.KeepAlive(dst)
	ops := make([]getOp, 0, max(1, len(dst)))
	kvtransfer.ProbeLayout(dst, x.Size, func(piece []byte, off int) {
		ops = append(ops, opInto(piece, x.Base+uint64(off)))
	})
	return c.gets(ctx, x, ops, ops[0].n)
}

// Lanes describes the endpoint to the agent at this connection's address:
// ucp_ep_print_info's text, which names the transport and device of every
// lane (the rma lanes carry the gets).
func (c *ucxConn) Lanes(ctx context.Context) (string, error) {
	x, err := c.probeInfo(ctx)
	if err != nil {
		return "", err
	}
	ep, err := c.endpoint(x.Plain.Worker)
	if err != nil {
		return "", err
	}
	// Lanes are complete once wire-up is: one get makes sure of it.
	if err := c.probeFrom(ctx, x.Plain, nil); err != nil {
		return "", err
	}
	return ep.info(), nil
}

// PeerFailureDetection reports whether UCX watches the agent's liveness
// on the endpoint (false on transports without it, e.g. UCX 1.13's shared
// memory: there the control connection and the pull deadline do).
func (c *ucxConn) PeerFailureDetection() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ep != nil && c.ep.peerErr
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

var (
	_ kvtransfer.Transport = (*Transport)(nil)
	_ kvtransfer.Listener  = (*ucxListener)(nil)
	_ kvtransfer.Conn      = (*ucxConn)(nil)
	_ kvtransfer.Prober    = (*ucxConn)(nil)
)
