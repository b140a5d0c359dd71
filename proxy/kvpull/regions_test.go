package kvpull

import (
	"errors"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// newTestPuller is the pull machinery of cfg over tr, which has no agent.
func newTestPuller(t *testing.T, cfg Config, tr kvtransfer.Transport) *Puller {
	t.Helper()
	p, err := kvtransfer.NewPuller(tr, kvtransfer.PullerConfig{})
	require.NoError(t, err)
	return New(cfg, Deps{Puller: p})
}

// engineRegions creates n host regions of 4 blocks of 4096 bytes, as a
// local engine's, and returns their paths.
func engineRegions(t *testing.T, n int) []string {
	t.Helper()
	dir := t.TempDir()
	paths := make([]string, n)
	for i := range paths {
		paths[i] = filepath.Join(dir, "engine"+strconv.Itoa(i)+".kv")
		reg, err := kvtransfer.CreateHostRegion(paths[i], 4, 4096)
		require.NoError(t, err)
		t.Cleanup(func() { _ = reg.Close() })
	}
	return paths
}

// TestKVRegionCacheEvictsOnlyUnusedMappings: the cache of mapped engine
// regions stays bounded, unmaps what it evicts, and never unmaps a region
// a pull is still writing into.
func TestKVRegionCacheEvictsOnlyUnusedMappings(t *testing.T) {
	paths := engineRegions(t, 4)
	k := newTestPuller(t, Config{MaxRegions: 2}, kvtransfer.NewMemTransport())

	a, err := k.region(paths[0], 4096) // held: a pull writes into it
	require.NoError(t, err)
	b, err := k.region(paths[1], 4096)
	require.NoError(t, err)
	k.unref(b)
	assert.Len(t, k.regions, 2)

	c, err := k.region(paths[2], 4096) // evicts b, the unused one
	require.NoError(t, err)
	assert.Len(t, k.regions, 2)
	assert.NotContains(t, k.regions, paths[1])
	_, err = b.reg.Block(0)
	assert.Error(t, err, "the evicted mapping is unmapped")
	_, err = a.reg.Block(0)
	assert.NoError(t, err, "the mapping in use is kept")

	// Every cached mapping in use: the new one is used once, then unmapped.
	d, err := k.region(paths[3], 4096)
	require.NoError(t, err)
	assert.Len(t, k.regions, 2)
	assert.False(t, d.cached)
	k.unref(d)
	_, err = d.reg.Block(0)
	assert.Error(t, err, "an uncached mapping is unmapped by its last user")

	k.unref(a)
	k.unref(c)
	_, err = a.reg.Block(0)
	assert.NoError(t, err, "cached mappings stay mapped for the next pull")
}

// registrar is a transport that records its local registrations.
type registrar struct {
	*kvtransfer.MemTransport
	live  map[*kvtransfer.Region]bool
	calls []string
}

func (r *registrar) RegisterLocal(reg *kvtransfer.Region) error {
	r.live[reg] = true
	r.calls = append(r.calls, "register "+reg.Path())
	return nil
}

func (r *registrar) DeregisterLocal(reg *kvtransfer.Region) error {
	_, err := reg.Block(0)
	if err != nil || !r.live[reg] {
		return errors.New("deregistered after the unmap, or twice")
	}
	delete(r.live, reg)
	r.calls = append(r.calls, "deregister "+reg.Path())
	return nil
}

// TestKVRegionCacheRegistersMappingsOnce: a transport that can register a
// destination region once (nixl) gets each cached mapping registered once
// for all its pulls, and deregistered before it is unmapped; a mapping used
// once is never registered.
func TestKVRegionCacheRegistersMappingsOnce(t *testing.T) {
	paths := engineRegions(t, 3)
	r := &registrar{MemTransport: kvtransfer.NewMemTransport(), live: map[*kvtransfer.Region]bool{}}
	k := newTestPuller(t, Config{MaxRegions: 1}, r)

	for range 3 { // three pulls into the same engine's region
		a, err := k.region(paths[0], 4096)
		require.NoError(t, err)
		k.unref(a)
	}
	assert.Equal(t, []string{"register " + paths[0]}, r.calls)

	held, err := k.region(paths[1], 4096) // evicts and unmaps the first
	require.NoError(t, err)
	once, err := k.region(paths[2], 4096) // cache full and in use: used once
	require.NoError(t, err)
	k.unref(once)
	k.unref(held)
	assert.Equal(t, []string{"register " + paths[0], "deregister " + paths[0], "register " + paths[1]}, r.calls)
	assert.Len(t, r.live, 1)
}
