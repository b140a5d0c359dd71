package kvpull

import (
	"fmt"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// localRegistrar is a transport that registers a destination region once
// for every later read into it (nixl's RegisterLocal), and undoes it
// before the region is unmapped.
type localRegistrar interface {
	RegisterLocal(r *kvtransfer.Region) error
	DeregisterLocal(r *kvtransfer.Region) error
}

// mappedRegion is a cached mapping of a local engine's KV region and the
// number of pulls writing into it now; it is unmapped only when none is.
type mappedRegion struct {
	reg        *kvtransfer.Region
	refs       int
	cached     bool // false once evicted: the last user unmaps it
	registered bool // with the transport (Puller.local)
}

// destination maps the engine's region (cached) and returns the borrowed
// blocks' bytes, and done, to call once the pull no longer writes them.
func (k *Puller) destination(a allocAnswer, src kvtransfer.Source) ([][]byte, func(), error) {
	if a.Region.Kind != kvtransfer.KindHost {
		return nil, nil, fmt.Errorf("local region of kind %q: %w", a.Region.Kind, kvtransfer.ErrUnsupported)
	}
	if a.Region.BlockBytes != src.BlockBytes {
		return nil, nil, fmt.Errorf("local blocks of %d bytes, remote %d: %w", a.Region.BlockBytes, src.BlockBytes, kvtransfer.ErrKVSize)
	}
	m, err := k.region(a.Region.Path, a.Region.BlockBytes)
	if err != nil {
		return nil, nil, err
	}
	done := func() { k.unref(m) }
	dst, err := m.reg.Blocks(a.BlockIDs)
	if err != nil {
		done()
		return nil, nil, err
	}
	return dst, done, nil
}

// region returns path's mapping with a reference taken. The cache holds
// MaxRegions mappings; past that an unused one is evicted and unmapped (an
// engine restart leaves its old file behind), and if every one is in use
// the new mapping is used once and unmapped after.
func (k *Puller) region(path string, blockBytes int) (*mappedRegion, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if m, ok := k.regions[path]; ok && m.reg.BlockBytes() == blockBytes {
		m.refs++
		return m, nil
	}
	reg, err := kvtransfer.OpenHostRegion(path, blockBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", kvtransfer.ErrUnsupported, err)
	}
	m := &mappedRegion{reg: reg, refs: 1}
	if old, ok := k.regions[path]; ok { // same path, other block size
		k.evict(path, old)
	}
	if len(k.regions) >= k.cfg.MaxRegions {
		for p, old := range k.regions {
			if old.refs == 0 {
				k.evict(p, old)
				break
			}
		}
	}
	if len(k.regions) < k.cfg.MaxRegions {
		m.cached = true
		k.regions[path] = m
		// Registered once for every pull into it while it stays mapped;
		// if the transport refuses, each read registers its blocks.
		if k.local != nil && k.local.RegisterLocal(reg) == nil {
			m.registered = true
		}
	}
	return m, nil
}

// unmap deregisters m from the transport (no pull writes into it) and
// unmaps it. Called with k.mu held.
func (k *Puller) unmap(m *mappedRegion) {
	if m.registered {
		_ = k.local.DeregisterLocal(m.reg)
		m.registered = false
	}
	_ = m.reg.Close()
}

// evict drops m from the cache, unmapping it unless a pull still writes
// into it (then its last user does). Called with k.mu held.
func (k *Puller) evict(path string, m *mappedRegion) {
	delete(k.regions, path)
	m.cached = false
	if m.refs == 0 {
		k.unmap(m)
	}
}

// unref returns a reference taken by region.
func (k *Puller) unref(m *mappedRegion) {
	k.mu.Lock()
	defer k.mu.Unlock()
	m.refs--
	if m.refs == 0 && !m.cached {
		k.unmap(m)
	}
}
