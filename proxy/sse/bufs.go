package sse

import (
	"slices"
	"sync"

	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Bufs recycles the per-stream buffers of finished streams: event readers'
// read buffers and chunk buffers; and, in Bodies, the buffers of long
// request bodies and of the legs that carry them. A proxy owns one; the
// zero value works. It is safe for concurrent use.
type Bufs struct {
	readers sync.Pool // *bufio.Reader of readerSize
	chunks  sync.Pool // *[]byte
	// Bodies holds body buffers by size class; a chunk grown past
	// MaxPooledChunk goes back there.
	Bodies upstream.BodyPool
}

// MaxPooledChunk is the largest chunk buffer kept for reuse (in the chunk
// pool; a larger one goes back to its body size class), and the longest
// event whose assembly buffer a Reader keeps for the rest of its stream.
const MaxPooledChunk = 64 << 10

// GetChunk returns an empty chunk buffer (4 KiB or more) and its pool
// entry, for PutChunk.
func (b *Bufs) GetChunk() (*[]byte, []byte) {
	p, _ := b.chunks.Get().(*[]byte)
	if p == nil {
		buf := make([]byte, 0, 4<<10)
		p = &buf
	}
	return p, (*p)[:0]
}

// PutChunk gives back a chunk buffer taken with GetChunk; buf is the buffer
// as grown since: one grown past MaxPooledChunk by GrowChunk goes back to
// its body size class, one grown otherwise is dropped.
func (b *Bufs) PutChunk(p *[]byte, buf []byte) {
	switch {
	case p == nil:
	case cap(buf) <= MaxPooledChunk:
		*p = buf[:0]
		b.chunks.Put(p)
	default:
		*p = buf
		b.Bodies.Put(p)
	}
}

// EditScratch returns a buffer for an edited copy of a body of n bytes
// that a leg copies at once (give it back with PutScratch): a chunk buffer
// for a body up to MaxPooledChunk, else one of the body pool with room
// for the edits. An edit that outgrows it allocates its own; the buffer
// given back is then the one taken, untouched.
func (b *Bufs) EditScratch(n int) (*[]byte, []byte) {
	if n <= MaxPooledChunk {
		p, buf := b.GetChunk()
		if cap(buf) < n+chunkEditRoom {
			buf = slices.Grow(buf, n+chunkEditRoom)
			*p = buf
		}
		return p, buf
	}
	p := b.Bodies.Get(n + editRoom)
	return p, *p
}

// chunkEditRoom is what a short body's edits add, as a rule (a prefill
// leg's kv_transfer_params, a decode leg's with a short prompt's block
// ids).
const chunkEditRoom = 2 << 10

// editRoom is what a leg's edits add to a body, as a rule (a
// kv_transfer_params with a long prompt's block ids): a larger edit grows
// the buffer itself.
const editRoom = 16 << 10

// PutScratch gives back a buffer of EditScratch (nil: none), to the pool
// it came from: the chunk pool holds none larger than MaxPooledChunk, the
// body pool none as small.
func (b *Bufs) PutScratch(p *[]byte) {
	switch {
	case p == nil:
	case cap(*p) <= MaxPooledChunk:
		b.PutChunk(p, *p)
	default:
		b.Bodies.Put(p)
	}
}

// GrowChunk makes room for n more bytes in buf, a chunk buffer (entry p):
// a chunk that would grow past MaxPooledChunk (a leg carrying a long body)
// moves to a buffer of the body pool with room for all, its bytes copied
// once, instead of doubling by append.
func (b *Bufs) GrowChunk(p *[]byte, buf []byte, n int) (*[]byte, []byte) {
	if cap(buf)-len(buf) >= n || len(buf)+n <= MaxPooledChunk {
		return p, buf
	}
	np := b.Bodies.Get(len(buf) + n)
	nb := append(*np, buf...)
	b.PutChunk(p, buf)
	return np, nb
}
