package upstream

import (
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

// TestBodyPool: Get gives an empty buffer with room for n; Put takes back
// only buffers of a class's exact capacity; one past the largest class is
// made to size.
func TestBodyPool(t *testing.T) {
	var p BodyPool
	b := p.Get(200 << 10)
	require.Empty(t, *b)
	require.Equal(t, 256<<10, cap(*b))
	*b = append(*b, 'x')
	p.Put(b)
	again := p.Get(129 << 10) // the same class; maybe the same buffer, emptied
	assert.Empty(t, *again)
	assert.Equal(t, 256<<10, cap(*again))
	huge := p.Get(64<<20 + 1)
	assert.Equal(t, 64<<20+1, cap(*huge))
	p.Put(huge) // dropped, no panic
	odd := make([]byte, 0, 100<<10)
	p.Put(&odd) // not a class's capacity: dropped
	p.Put(nil)
}
