package upstream

import (
	"math/bits"
	"sync"
)

// Long request bodies (a prompt of 10k-100k tokens is 70-700 KB) are read
// into, and their legs built in, buffers of their whole size taken from
// size classes, powers of two from bodyClassMin to bodyClassMax: a buffer
// grown by appending would copy the body once per doubling, and one made
// for each request and dropped costs its zeroing and the collector's work.
const (
	bodyClassMinShift = 15 // 32 KiB
	bodyClassMaxShift = 26 // 64 MiB
	bodyClasses       = bodyClassMaxShift - bodyClassMinShift + 1
)

// BodyPool recycles body buffers by size class; the zero value works. It
// is safe for concurrent use.
type BodyPool struct {
	classes [bodyClasses]sync.Pool // *[]byte of cap 1<<(bodyClassMinShift+i)
}

// bodyClass is the class whose buffers hold n bytes, or -1 for n past the
// largest class (such a buffer is made for the request and not pooled).
func bodyClass(n int) int {
	if n <= 1<<bodyClassMinShift {
		return 0
	}
	shift := bits.Len(uint(n - 1))
	if shift > bodyClassMaxShift {
		return -1
	}
	return shift - bodyClassMinShift
}

// Get returns an empty buffer with room for n bytes.
func (b *BodyPool) Get(n int) *[]byte {
	c := bodyClass(n)
	if c < 0 {
		buf := make([]byte, 0, n)
		return &buf
	}
	if p, _ := b.classes[c].Get().(*[]byte); p != nil {
		*p = (*p)[:0]
		return p
	}
	buf := make([]byte, 0, 1<<(bodyClassMinShift+c))
	return &buf
}

// Put gives back a buffer from Get (one of another capacity is dropped).
func (b *BodyPool) Put(p *[]byte) {
	if p == nil {
		return
	}
	c := bodyClass(cap(*p))
	if c < 0 || cap(*p) != 1<<(bodyClassMinShift+c) {
		return
	}
	*p = (*p)[:0]
	b.classes[c].Put(p)
}
