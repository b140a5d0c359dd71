package kvtransfer

import (
	"fmt"
	"os"
	"syscall"
)

// Kind is how a region's memory is registered.
type Kind string

// Memory kinds.
const (
	// KindHost is a shared-memory file mapped by the engine and the sidecar
	// (what the engine simulator uses), or plain process memory.
	KindHost Kind = "host"
	// KindCUDA is device memory opened from the engine's CUDA IPC handle.
	// Only CUDA builds can open it; elsewhere OpenCUDARegion returns
	// ErrUnsupported.
	KindCUDA Kind = "cuda"
)

// Region is a registered block array: block id i occupies bytes
// [i*BlockBytes, (i+1)*BlockBytes) of Mem. A Region is safe for concurrent
// use as long as concurrent users touch disjoint blocks.
type Region struct {
	name       string
	kind       Kind
	path       string
	mem        []byte
	blockBytes int
	mapped     bool
}

// NewMemRegion returns a process-memory region of numBlocks blocks (tests,
// the in-memory transport, benchmarks). Close unmaps it.
func NewMemRegion(name string, numBlocks, blockBytes int) (*Region, error) {
	if numBlocks <= 0 || blockBytes <= 0 {
		return nil, fmt.Errorf("region %s: %d blocks of %d bytes: %w", name, numBlocks, blockBytes, ErrKVSize)
	}
	// Anonymous mapping, not the Go heap: transports may register it
	// (ucp_mem_map) and keep using it from C.
	mem, err := syscall.Mmap(-1, 0, numBlocks*blockBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("region %s: mmap: %w", name, err)
	}
	return &Region{name: name, kind: KindHost, mem: mem, blockBytes: blockBytes, mapped: true}, nil
}

// CreateHostRegion creates (or truncates) the shared-memory file at path,
// sized for numBlocks blocks, and maps it read-write and shared.
func CreateHostRegion(path string, numBlocks, blockBytes int) (*Region, error) {
	if numBlocks <= 0 || blockBytes <= 0 {
		return nil, fmt.Errorf("region %s: %d blocks of %d bytes: %w", path, numBlocks, blockBytes, ErrKVSize)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create host region: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(int64(numBlocks) * int64(blockBytes)); err != nil {
		return nil, fmt.Errorf("size host region %s: %w", path, err)
	}
	return mapFile(f, path, blockBytes)
}

// OpenHostRegion maps an existing shared-memory file created by the engine.
func OpenHostRegion(path string, blockBytes int) (*Region, error) {
	if blockBytes <= 0 {
		return nil, fmt.Errorf("region %s: block size %d: %w", path, blockBytes, ErrKVSize)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open host region: %w", err)
	}
	defer f.Close()
	return mapFile(f, path, blockBytes)
}

func mapFile(f *os.File, path string, blockBytes int) (*Region, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat host region %s: %w", path, err)
	}
	size := int(st.Size())
	if size == 0 || size%blockBytes != 0 {
		return nil, fmt.Errorf("host region %s: size %d is not a positive multiple of %d: %w", path, size, blockBytes, ErrKVSize)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap host region %s: %w", path, err)
	}
	return &Region{name: path, kind: KindHost, path: path, mem: mem, blockBytes: blockBytes, mapped: true}, nil
}

// OpenCUDARegion would open device memory from a CUDA IPC handle. This build
// has no CUDA support.
func OpenCUDARegion(handle []byte, size, blockBytes int) (*Region, error) {
	return nil, fmt.Errorf("cuda region (%d-byte handle, %d bytes): %w: built without CUDA", len(handle), size, ErrUnsupported)
}

// Name identifies the region (its path for host files).
func (r *Region) Name() string { return r.name }

// Kind is the region's memory kind.
func (r *Region) Kind() Kind { return r.kind }

// Path is the shared-memory file backing a host region ("" for process
// memory).
func (r *Region) Path() string { return r.path }

// BlockBytes is the size of one block.
func (r *Region) BlockBytes() int { return r.blockBytes }

// NumBlocks is the number of blocks.
func (r *Region) NumBlocks() int { return len(r.mem) / r.blockBytes }

// Mem is the whole region. Transports register it (ucp_mem_map) as one
// piece.
func (r *Region) Mem() []byte { return r.mem }

// Block returns block id's bytes (aliasing the region).
func (r *Region) Block(id int) ([]byte, error) {
	if id < 0 || id >= r.NumBlocks() {
		return nil, fmt.Errorf("region %s: block %d out of range 0..%d: %w", r.name, id, r.NumBlocks()-1, ErrKVSize)
	}
	off := id * r.blockBytes
	return r.mem[off : off+r.blockBytes : off+r.blockBytes], nil
}

// Blocks returns the bytes of each id, in order.
func (r *Region) Blocks(ids []int) ([][]byte, error) {
	out := make([][]byte, len(ids))
	for i, id := range ids {
		b, err := r.Block(id)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

// Close unmaps a mapped region. The file stays (its creator removes it).
func (r *Region) Close() error {
	if !r.mapped {
		return nil
	}
	r.mapped = false
	if err := syscall.Munmap(r.mem); err != nil {
		return fmt.Errorf("munmap %s: %w", r.name, err)
	}
	r.mem = nil
	return nil
}
