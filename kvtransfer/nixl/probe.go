//go:build cgo

package nixl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// probeBytes is the size of the filler region every agent serves to
// kv-probe (the largest block size it reads in one descriptor).
const probeBytes = 4 << 20

// serveProbe maps and registers the probe region: memory the agent
// allocated itself (as an engine allocates its KV), filled with filler.
func (l *nixlListener) serveProbe() error {
	r, err := kvtransfer.NewMemRegion("nixl-probe", 1, probeBytes)
	if err != nil {
		return err
	}
	mem := r.Mem()
	for i := range mem {
		mem[i] = byte(i*7 + 1)
	}
	d, kind, err := regionDesc(r)
	if err == nil {
		err = l.na.Register(kind, []Desc{d})
	}
	if err != nil {
		_ = r.Close()
		return fmt.Errorf("probe region: %w", err)
	}
	l.probeRegion = r
	l.descs = append(l.descs, regDesc{kind, d})
	l.probe = extra{Agent: l.na.Name(), Base: uint64(d.Addr), Mem: kind, Dev: d.DevID, Size: probeBytes}
	return nil
}

// infoConn is the control connection's Info call (kvtransfer's tcp Conn).
type infoConn interface {
	Info(ctx context.Context) ([]byte, error)
}

// probeInfo returns the agent's info answer, asked once per connection.
func (c *nixlConn) probeInfo(ctx context.Context) (extra, error) {
	c.mu.Lock()
	p := c.probe
	c.mu.Unlock()
	if p != nil {
		return *p, nil
	}
	ic, ok := c.Conn.(infoConn)
	if !ok {
		return extra{}, fmt.Errorf("nixl: the control connection cannot ask for info: %w", kvtransfer.ErrUnsupported)
	}
	b, err := ic.Info(ctx)
	if err != nil {
		return extra{}, err
	}
	var x extra
	if err := json.Unmarshal(b, &x); err != nil || x.Agent == "" || len(x.MD) == 0 || x.Size <= 0 {
		return extra{}, fmt.Errorf("nixl agent info without metadata and a probe region: %w", kvtransfer.ErrKVProtocol)
	}
	c.mu.Lock()
	c.probe = &x
	c.mu.Unlock()
	return x, nil
}

// Probe reads filler from the agent's probe region into every block of dst
// with NIXL READ requests, as Read moves blocks (the destination registered
// for the call, as a pull's is); with no blocks it reads 64 bytes.
func (c *nixlConn) Probe(ctx context.Context, dst [][]byte) error {
	x, err := c.probeInfo(ctx)
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(dst)
	var local, remote []Desc
	kvtransfer.ProbeLayout(dst, x.Size, func(piece []byte, off int) {
		local = append(local, Desc{Addr: uintptr(unsafe.Pointer(unsafe.SliceData(piece))), Len: len(piece)})
		remote = append(remote, Desc{Addr: uintptr(x.Base) + uintptr(off), Len: len(piece), DevID: x.Dev})
	})
	if err := c.remote(x); err != nil {
		return err
	}
	if spans := mergeSpans(local); !c.registered(spans) {
		if err := c.na.Register(MemDRAM, spans); err != nil {
			return fmt.Errorf("nixl register probe destination: %w: %w", kvtransfer.ErrUnsupported, err)
		}
		defer func() { _ = c.na.Deregister(MemDRAM, spans) }()
	}
	if err := c.na.Read(ctx, MemDRAM, x.Mem, local, remote, x.Agent); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("nixl read: %w", errors.Join(ctx.Err(), err))
		}
		c.forget(x.Agent)
		c.mu.Lock()
		c.probe = nil // a restarted agent answers with new metadata
		c.mu.Unlock()
		return fmt.Errorf("nixl probe read from %s: %w: %w", x.Agent, kvtransfer.ErrKVSourceGone, err)
	}
	return nil
}

// mergeSpans returns the memory ds cover as disjoint descriptors (blocks
// that share memory, e.g. kv-probe --same-buffer, registered once).
func mergeSpans(ds []Desc) []Desc {
	s := slices.Clone(ds)
	slices.SortFunc(s, func(a, b Desc) int {
		switch {
		case a.Addr < b.Addr:
			return -1
		case a.Addr > b.Addr:
			return 1
		}
		return 0
	})
	out := s[:0]
	for _, d := range s {
		if n := len(out); n > 0 && d.Addr <= out[n-1].Addr+uintptr(out[n-1].Len) {
			end := max(out[n-1].Addr+uintptr(out[n-1].Len), d.Addr+uintptr(d.Len))
			out[n-1].Len = int(end - out[n-1].Addr)
			continue
		}
		out = append(out, d)
	}
	return out
}
