package enginesim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func seq(n, base int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = base + i
	}
	return out
}

func TestBlockHashesChainPrefix(t *testing.T) {
	a := seq(40, 100)                         // 2 full blocks + 8 tokens
	b := append(seq(32, 100), seq(8, 900)...) // same first 32 tokens
	ha, hb := BlockHashes(a, 16), BlockHashes(b, 16)
	require.Len(t, ha, 3)
	require.Len(t, hb, 3)
	assert.Equal(t, ha[:2], hb[:2], "a shared prefix gives the same block hashes")
	assert.NotEqual(t, ha[2], hb[2])

	c := append([]int{7}, a[1:]...) // first token differs: every later block differs too
	hc := BlockHashes(c, 16)
	for j := range ha {
		assert.NotEqual(t, ha[j], hc[j], "block %d depends on the whole prefix", j)
	}
	assert.NotEqual(t, BlockHashes(seq(15, 100), 16)[0], BlockHashes(seq(16, 100), 16)[0], "a partial block hashes its length")
}

func TestFillBlock(t *testing.T) {
	buf := make([]byte, 64)
	FillBlock(buf, 42, 24)
	assert.Equal(t, make([]byte, 40), buf[24:], "unfilled slots are zero")
	assert.NotEqual(t, make([]byte, 24), buf[:24])
	again := make([]byte, 64)
	FillBlock(again, 42, 24)
	assert.Equal(t, buf, again)
}

func TestFingerprintsWithCacheEqualComputed(t *testing.T) {
	tokens := seq(50, 300)
	hashes := BlockHashes(tokens, 16)
	cold, hits := Fingerprints(tokens, 16, 64, hashes, nil)
	require.Zero(t, hits)
	c := newPrefixCache(100)
	for j := 0; j < 3; j++ { // the three full blocks
		c.put(hashes[j], cold[j])
	}
	warm, hits := Fingerprints(tokens, 16, 64, hashes, func(j int) (uint64, bool) { return c.get(hashes[j]) })
	assert.Equal(t, 3, hits)
	assert.Equal(t, cold, warm)
}

func TestGenerationIsAFunctionOfKVContent(t *testing.T) {
	tokens := seq(40, 500)
	hashes := BlockHashes(tokens, 16)
	blocks := make([][]byte, len(hashes))
	fps := make([]uint64, len(hashes))
	for j, h := range hashes {
		blocks[j] = make([]byte, 16*64)
		FillBlock(blocks[j], h, BlockTokens(len(tokens), 16, j)*64)
		fps[j] = Fingerprint(blocks[j])
	}
	computed, _ := Fingerprints(tokens, 16, 64, hashes, nil)
	require.Equal(t, computed, fps, "bytes a puller receives fingerprint like a local prefill")

	gen := func(fps []uint64) []int {
		d := Digest(fps)
		out := make([]int, 8)
		for i := range out {
			out[i] = GenerateToken(d, i)
		}
		return out
	}
	want := gen(fps)
	assert.Equal(t, want, gen(fps), "deterministic")

	for _, at := range []struct{ block, byteAt int }{{0, 0}, {1, 500}, {2, 8*64 - 1}} {
		bad := append([]byte{}, blocks[at.block]...)
		bad[at.byteAt] ^= 1
		badFps := append([]uint64{}, fps...)
		badFps[at.block] = Fingerprint(bad)
		assert.NotEqual(t, want, gen(badFps), "one flipped bit in block %d changes the output", at.block)
	}
	assert.NotEqual(t, want, gen(fps[:2]), "missing blocks change the output")
}

func TestPrefixCacheLRU(t *testing.T) {
	c := newPrefixCache(2)
	c.put(1, 10)
	c.put(2, 20)
	_, _ = c.get(1) // 1 is now most recent
	c.put(3, 30)    // evicts 2
	_, ok := c.get(2)
	assert.False(t, ok)
	fp, ok := c.get(1)
	assert.True(t, ok)
	assert.Equal(t, uint64(10), fp)
	assert.Equal(t, 2, c.len())
}
