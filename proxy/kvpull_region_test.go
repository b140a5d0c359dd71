package proxy

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// TestKVRegionCacheEvictsOnlyUnusedMappings: the cache of mapped engine
// regions stays bounded, unmaps what it evicts, and never unmaps a region
// a pull is still writing into.
func TestKVRegionCacheEvictsOnlyUnusedMappings(t *testing.T) {
	dir := t.TempDir()
	paths := make([]string, 4)
	for i := range paths {
		paths[i] = filepath.Join(dir, "engine"+strconv.Itoa(i)+".kv")
		reg, err := kvtransfer.CreateHostRegion(paths[i], 4, 4096)
		require.NoError(t, err)
		t.Cleanup(func() { _ = reg.Close() })
	}
	k := &kvPull{cfg: KVPullConfig{MaxRegions: 2}, regions: map[string]*mappedRegion{}}

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
