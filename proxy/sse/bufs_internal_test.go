package sse

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGrowChunk: a chunk that must grow past MaxPooledChunk moves once to
// a body buffer with room for all, its bytes kept; a small growth stays
// with append; PutChunk takes either back.
func TestGrowChunk(t *testing.T) {
	var bufs Bufs
	p, buf := bufs.GetChunk()
	buf = append(buf, "head"...)
	p2, buf2 := bufs.GrowChunk(p, buf, 100)
	assert.Same(t, p, p2, "room enough, or small: unchanged")
	body := bytes.Repeat([]byte("b"), 300<<10)
	p3, buf3 := bufs.GrowChunk(p2, buf2, len(body))
	require.GreaterOrEqual(t, cap(buf3)-len(buf3), len(body))
	assert.Equal(t, "head", string(buf3))
	buf3 = append(buf3, body...)
	assert.Equal(t, 512<<10, cap(buf3), "no growth by append")
	bufs.PutChunk(p3, buf3)
	assert.Equal(t, 512<<10, cap(*bufs.Bodies.Get(300 << 10)), "its class: 512 KiB")
}

// An edit's scratch has room for the body and its edits, short or long,
// and goes back to the pool it came from.
func TestEditScratch(t *testing.T) {
	var b Bufs
	for _, n := range []int{0, 1200, 10 << 10, MaxPooledChunk, MaxPooledChunk + 1, 1 << 20} {
		p, buf := b.EditScratch(n)
		if p == nil || len(buf) != 0 || cap(buf) < n+1024 {
			t.Fatalf("EditScratch(%d): entry %v, len %d, cap %d", n, p != nil, len(buf), cap(buf))
		}
		b.PutScratch(p)
	}
	b.PutScratch(nil)
}
