package kvtransfer

import "unsafe"

// ProbeMinBytes is what a probe with no blocks reads: the transport's
// smallest round trip over its data path.
const ProbeMinBytes = 64

// ProbeLayout maps the blocks of a probe (see Prober) onto an agent's
// filler region of regionBytes: it calls read(piece, off) for every piece
// of dst, at most regionBytes long, with the region offset to read it from,
// cycling through the region. A block read into the same memory as the one
// before it (kv-probe --same-buffer) is read from the same offset too, as
// ucx_perftest reads: one remote buffer into one local buffer. No blocks
// means one read of ProbeMinBytes.
func ProbeLayout(dst [][]byte, regionBytes int, read func(piece []byte, off int)) {
	if len(dst) == 0 {
		dst = [][]byte{make([]byte, ProbeMinBytes)}
	}
	off, last := 0, 0
	for i, d := range dst {
		if i > 0 && len(d) <= regionBytes && unsafe.SliceData(d) == unsafe.SliceData(dst[i-1]) {
			read(d, last)
			continue
		}
		for lo := 0; lo < len(d); lo += regionBytes {
			piece := d[lo:min(len(d), lo+regionBytes)]
			if off+len(piece) > regionBytes {
				off = 0
			}
			read(piece, off)
			last = off
			off += len(piece)
		}
	}
}
