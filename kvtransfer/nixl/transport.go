//go:build cgo

package nixl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// Transport is the nixl transport: control (open, complete, release) over
// kvtransfer's tcp protocol, data by NIXL READ transfers from the agent's
// registered regions into the puller's memory. The agent's NIXL metadata
// (nixl_capi_get_local_md), its agent name, the region's base address and
// memory type travel in Grant.Extra; the puller loads the metadata once per
// remote agent. NIXL and its backend read their own environment
// (NIXL_PLUGIN_DIR, UCX_*).
type Transport struct {
	cfg Config
	lib *Lib

	mu      sync.Mutex
	puller  *Agent              // the pullers' agent, created on first Dial
	remotes map[string]struct{} // remote agents whose metadata puller loaded
	local   []span              // memory registered with puller by RegisterLocal
}

type span struct{ lo, hi uintptr }

// New loads NIXL's C API library (cfg.Library) and returns the transport.
// A missing or unusable library is the one error, wrapping
// ErrLibraryMissing and kvtransfer.ErrUnsupported. Agents are created on
// Listen and on the first Dial.
func New(cfg Config) (*Transport, error) {
	cfg = cfg.withDefaults()
	lib, err := Open(cfg.Library)
	if err != nil {
		return nil, err
	}
	return &Transport{cfg: cfg, lib: lib, remotes: map[string]struct{}{}}, nil
}

// Name returns "nixl".
func (*Transport) Name() string { return "nixl" }

// Lib is the loaded library.
func (t *Transport) Lib() *Lib { return t.lib }

// agentName is unique across the fleet: prefix, host, pid, random suffix.
func (t *Transport) agentName(role string) string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%s-%s-%d-%s", t.cfg.AgentPrefix, role, host, os.Getpid(), hex.EncodeToString(b[:]))
}

// extra is Grant.Extra of the nixl transport.
type extra struct {
	// Agent is the agent's NIXL name; MD its metadata.
	Agent string `json:"agent"`
	MD    []byte `json:"md"`
	// Base is the address of the hold's region in the agent; Mem and Dev
	// its NIXL memory type and device id.
	Base uint64  `json:"base"`
	Mem  MemType `json:"mem"`
	Dev  uint64  `json:"dev"`
	// Pace is the agent's bandwidth cap (bytes/s, 0: none), honoured by the
	// puller: one-sided reads cannot be paced by the agent.
	Pace float64 `json:"pace,omitempty"`
	// Size is the probe region's size (the agent's info answer only).
	Size int `json:"size,omitempty"`
}

// regionDesc is the NIXL descriptor of a whole region.
func regionDesc(r *kvtransfer.Region) (Desc, MemType, error) {
	if r.Kind() != kvtransfer.KindHost {
		return Desc{}, 0, fmt.Errorf("nixl: region %s of kind %s: %w", r.Name(), r.Kind(), kvtransfer.ErrUnsupported)
	}
	m := r.Mem()
	return Desc{Addr: uintptr(unsafe.Pointer(unsafe.SliceData(m))), Len: len(m)}, MemDRAM, nil
}

// Listen creates a NIXL agent with the configured backend, registers every
// region of a with it and serves the control protocol on addr.
func (t *Transport) Listen(ctx context.Context, addr string, a *kvtransfer.Agent) (kvtransfer.Listener, error) {
	na, err := t.lib.newAgent(t.agentName("agent"), t.cfg.Backend, t.cfg.ProgressDelay)
	if err != nil {
		return nil, fmt.Errorf("nixl listen %s: %w: %w", addr, kvtransfer.ErrUnsupported, err)
	}
	l := &nixlListener{na: na, regs: map[*kvtransfer.Region]extra{}}
	for _, r := range a.Regions() {
		d, mem, err := regionDesc(r)
		if err == nil {
			err = na.Register(mem, []Desc{d})
		}
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("nixl listen %s: region %s: %w", addr, r.Name(), err)
		}
		l.regs[r] = extra{Agent: na.Name(), Base: uint64(d.Addr), Mem: mem, Dev: d.DevID, Pace: a.Bandwidth()}
		l.descs = append(l.descs, regDesc{mem, d})
	}
	if err := l.serveProbe(); err != nil {
		l.Close()
		return nil, fmt.Errorf("nixl listen %s: %w", addr, err)
	}
	md, err := na.LocalMD()
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("nixl listen %s: %w: %w", addr, kvtransfer.ErrUnsupported, err)
	}
	probeInfo := l.probe
	probeInfo.MD = md
	info, err := json.Marshal(probeInfo)
	if err != nil {
		l.Close()
		return nil, err
	}
	tcp := kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{Info: func() ([]byte, error) { return info, nil }, GrantExtra: func(g *kvtransfer.Grant) error {
		r, err := a.Region(g.RequestID)
		if err != nil {
			return err
		}
		x, ok := l.regs[r]
		if !ok {
			return fmt.Errorf("region %s was registered after Listen: %w", r.Name(), kvtransfer.ErrKVProtocol)
		}
		x.MD = md
		g.Extra, err = json.Marshal(x)
		return err
	}})
	if l.ctl, err = tcp.Listen(ctx, addr, a); err != nil {
		l.Close()
		return nil, err
	}
	context.AfterFunc(ctx, func() { _ = l.Close() })
	return l, nil
}

type regDesc struct {
	mem MemType
	d   Desc
}

type nixlListener struct {
	na    *Agent
	ctl   kvtransfer.Listener
	regs  map[*kvtransfer.Region]extra
	descs []regDesc
	// probeRegion is filler served to kv-probe (never KV); probe is its
	// descriptor in an info answer.
	probeRegion *kvtransfer.Region
	probe       extra
	once        sync.Once
}

func (l *nixlListener) Addr() string { return l.ctl.Addr() }

// Close stops the control listener, deregisters the regions and destroys
// the agent: pullers' transfers from it then fail (ErrKVSourceGone).
func (l *nixlListener) Close() error {
	l.once.Do(func() {
		if l.ctl != nil {
			_ = l.ctl.Close()
		}
		for _, r := range l.descs {
			_ = l.na.Deregister(r.mem, []Desc{r.d})
		}
		l.na.Close()
		if l.probeRegion != nil {
			_ = l.probeRegion.Close()
		}
	})
	return nil
}

// pullerAgent returns the pullers' agent, creating it on first use.
func (t *Transport) pullerAgent() (*Agent, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.puller == nil {
		na, err := t.lib.newAgent(t.agentName("puller"), t.cfg.Backend, t.cfg.ProgressDelay)
		if err != nil {
			return nil, fmt.Errorf("nixl: %w: %w", kvtransfer.ErrUnsupported, err)
		}
		t.puller = na
	}
	return t.puller, nil
}

// RegisterLocal registers a local region with the pullers' agent once, so
// that Reads into it skip the per-read registration (which costs a memory
// registration per read with real NIXL backends). The region must stay
// mapped until Close.
func (t *Transport) RegisterLocal(r *kvtransfer.Region) error {
	na, err := t.pullerAgent()
	if err != nil {
		return err
	}
	d, mem, err := regionDesc(r)
	if err != nil {
		return err
	}
	if err := na.Register(mem, []Desc{d}); err != nil {
		return fmt.Errorf("nixl: register local region %s: %w: %w", r.Name(), kvtransfer.ErrUnsupported, err)
	}
	t.mu.Lock()
	t.local = append(t.local, span{d.Addr, d.Addr + uintptr(d.Len)})
	t.mu.Unlock()
	return nil
}

// DeregisterLocal undoes RegisterLocal for r. No Read into r may be in
// flight; r may be unmapped afterwards.
func (t *Transport) DeregisterLocal(r *kvtransfer.Region) error {
	d, mem, err := regionDesc(r)
	if err != nil {
		return err
	}
	t.mu.Lock()
	na := t.puller
	s := span{d.Addr, d.Addr + uintptr(d.Len)}
	i := slices.Index(t.local, s)
	if i >= 0 {
		t.local = slices.Delete(t.local, i, i+1)
	}
	t.mu.Unlock()
	if i < 0 || na == nil {
		return fmt.Errorf("nixl: local region %s was not registered: %w", r.Name(), kvtransfer.ErrKVProtocol)
	}
	if err := na.Deregister(mem, []Desc{d}); err != nil {
		return fmt.Errorf("nixl: deregister local region %s: %w", r.Name(), err)
	}
	return nil
}

// Close destroys the pullers' agent (Conns stop working). Listeners close
// on their own.
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.puller != nil {
		t.puller.Close()
		t.puller = nil
	}
	return nil
}

// Dial connects the control channel; the remote agent's metadata is loaded
// on the first Read, from the grant.
func (t *Transport) Dial(ctx context.Context, addr string) (kvtransfer.Conn, error) {
	na, err := t.pullerAgent()
	if err != nil {
		return nil, err
	}
	ctl, err := kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{}).Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &nixlConn{Conn: ctl, t: t, na: na}, nil
}

// nixlConn is the control connection plus the pullers' NIXL agent.
type nixlConn struct {
	kvtransfer.Conn // Open, Complete, Release over tcp
	t               *Transport
	na              *Agent
	mu              sync.Mutex
	probe           *extra // the agent's info answer, once asked
}

// remote makes sure the grant's agent metadata is loaded.
func (c *nixlConn) remote(x extra) error {
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	if _, ok := c.t.remotes[x.Agent]; ok {
		return nil
	}
	name, err := c.na.LoadRemoteMD(x.MD)
	if err != nil {
		return fmt.Errorf("nixl load metadata of %s: %w: %w", x.Agent, kvtransfer.ErrKVSourceGone, err)
	}
	if name != x.Agent {
		_ = c.na.InvalidateRemoteMD(name)
		return fmt.Errorf("nixl metadata names agent %q, grant %q: %w", name, x.Agent, kvtransfer.ErrKVProtocol)
	}
	c.t.remotes[x.Agent] = struct{}{}
	return nil
}

// forget drops a remote agent after a failed transfer, so a restarted
// agent's metadata is loaded afresh.
func (c *nixlConn) forget(name string) {
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	if _, ok := c.t.remotes[name]; ok {
		delete(c.t.remotes, name)
		_ = c.na.InvalidateRemoteMD(name)
	}
}

// registered reports whether every local descriptor lies in memory that
// RegisterLocal registered.
func (c *nixlConn) registered(ds []Desc) bool {
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	for _, d := range ds {
		in := false
		for _, s := range c.t.local {
			if d.Addr >= s.lo && d.Addr+uintptr(d.Len) <= s.hi {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	return true
}

// Read transfers the blocks with NIXL READ requests straight into dst, in
// chunks paced to the agent's cap when it has one. dst memory not
// registered with RegisterLocal is registered for the duration of the Read.
func (c *nixlConn) Read(ctx context.Context, g kvtransfer.Grant, idx []int, dst [][]byte) error {
	var x extra
	if err := json.Unmarshal(g.Extra, &x); err != nil || x.Agent == "" || len(x.MD) == 0 {
		return fmt.Errorf("nixl grant without agent metadata: %w", kvtransfer.ErrKVProtocol)
	}
	if len(idx) != len(dst) {
		return fmt.Errorf("%d indices for %d destinations: %w", len(idx), len(dst), kvtransfer.ErrKVSize)
	}
	if len(idx) == 0 {
		return nil
	}
	local, remote := make([]Desc, len(idx)), make([]Desc, len(idx))
	for k, i := range idx {
		if i < 0 || i >= len(g.BlockIDs) || len(dst[k]) != g.BlockBytes {
			return fmt.Errorf("block %d of %d bytes into %d: %w", i, g.BlockBytes, len(dst[k]), kvtransfer.ErrKVSize)
		}
		local[k] = Desc{Addr: uintptr(unsafe.Pointer(unsafe.SliceData(dst[k]))), Len: g.BlockBytes}
		remote[k] = Desc{Addr: uintptr(x.Base) + uintptr(g.BlockIDs[i])*uintptr(g.BlockBytes), Len: g.BlockBytes, DevID: x.Dev}
	}
	defer runtime.KeepAlive(dst)
	if err := c.remote(x); err != nil {
		return err
	}
	if !c.registered(local) {
		if err := c.na.Register(MemDRAM, local); err != nil {
			return fmt.Errorf("nixl register destination: %w: %w", kvtransfer.ErrUnsupported, err)
		}
		defer func() { _ = c.na.Deregister(MemDRAM, local) }()
	}
	batch := len(local)
	if x.Pace > 0 {
		batch = max(1, 16<<10/g.BlockBytes)
	}
	start := time.Now()
	var sent int64
	for lo := 0; lo < len(local); lo += batch {
		hi := min(lo+batch, len(local))
		if err := c.na.Read(ctx, MemDRAM, x.Mem, local[lo:hi], remote[lo:hi], x.Agent); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("nixl read: %w", ctx.Err())
			}
			c.forget(x.Agent)
			return fmt.Errorf("nixl read from %s: %w: %w", x.Agent, kvtransfer.ErrKVSourceGone, err)
		}
		sent += int64(hi-lo) * int64(g.BlockBytes)
		if x.Pace > 0 {
			due := time.Duration(float64(sent) / x.Pace * float64(time.Second))
			if wait := due - time.Since(start); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return fmt.Errorf("nixl read: %w", ctx.Err())
				}
			}
		}
	}
	return nil
}

var (
	_ kvtransfer.Transport = (*Transport)(nil)
	_ kvtransfer.Listener  = (*nixlListener)(nil)
	_ kvtransfer.Conn      = (*nixlConn)(nil)
	_ kvtransfer.Prober    = (*nixlConn)(nil)
)
