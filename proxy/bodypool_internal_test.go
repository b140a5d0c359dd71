package proxy

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBodyClass: a size's class holds it, and is the smallest that does.
func TestBodyClass(t *testing.T) {
	for _, tc := range []struct{ n, class int }{
		{0, 0}, {1, 0}, {32 << 10, 0}, {32<<10 + 1, 1}, {64 << 10, 1}, {200 << 10, 3}, {256 << 10, 3},
		{64 << 20, bodyClasses - 1}, {64<<20 + 1, -1},
	} {
		assert.Equal(t, tc.class, bodyClass(tc.n), "%d bytes", tc.n)
	}
}

// TestBodyPool: get gives an empty buffer with room for n; put takes back
// only buffers of a class's exact capacity; one past the largest class is
// made to size.
func TestBodyPool(t *testing.T) {
	var p bodyPool
	b := p.get(200 << 10)
	require.Empty(t, *b)
	require.Equal(t, 256<<10, cap(*b))
	*b = append(*b, 'x')
	p.put(b)
	again := p.get(129 << 10) // the same class; maybe the same buffer, emptied
	assert.Empty(t, *again)
	assert.Equal(t, 256<<10, cap(*again))
	huge := p.get(64<<20 + 1)
	assert.Equal(t, 64<<20+1, cap(*huge))
	p.put(huge) // dropped, no panic
	odd := make([]byte, 0, 100<<10)
	p.put(&odd) // not a class's capacity: dropped
	p.put(nil)
}

// TestGrowChunk: a chunk that must grow past maxPooledChunk moves once to
// a body buffer with room for all, its bytes kept; a small growth stays
// with append; putChunk takes either back.
func TestGrowChunk(t *testing.T) {
	var bufs streamBufs
	p, buf := bufs.getChunk()
	buf = append(buf, "head"...)
	p2, buf2 := bufs.growChunk(p, buf, 100)
	assert.Same(t, p, p2, "room enough, or small: unchanged")
	body := bytes.Repeat([]byte("b"), 300<<10)
	p3, buf3 := bufs.growChunk(p2, buf2, len(body))
	require.GreaterOrEqual(t, cap(buf3)-len(buf3), len(body))
	assert.Equal(t, "head", string(buf3))
	buf3 = append(buf3, body...)
	assert.Equal(t, 512<<10, cap(buf3), "no growth by append")
	bufs.putChunk(p3, buf3)
	assert.Equal(t, 512<<10, cap(*bufs.bodies.get(300 << 10)), "its class: 512 KiB")
}
