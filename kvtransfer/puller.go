package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// PullerConfig configures a Puller. Zero fields take the defaults noted.
type PullerConfig struct {
	// Streams is how many reads of one pull run in parallel (default 4).
	Streams int
	// Deadline bounds a whole pull, Open to Complete (default 10 s).
	Deadline time.Duration
	// SkipChecksums turns checksum verification off (sizes are still
	// verified). Verification costs one CRC-64 pass over the bytes.
	SkipChecksums bool
	// ReleaseTimeout bounds the release of the remote hold after a failed
	// pull (default 2 s).
	ReleaseTimeout time.Duration
	// MaxPeers bounds the cached connections (default 64); past it the
	// oldest is closed.
	MaxPeers int
}

// Validate reports an invalid setting.
func (c PullerConfig) Validate() error {
	if c.Streams < 0 || c.Deadline < 0 || c.ReleaseTimeout < 0 || c.MaxPeers < 0 {
		return fmt.Errorf("kvtransfer: puller settings must not be negative: %+v", c)
	}
	return nil
}

func (c PullerConfig) withDefaults() PullerConfig {
	if c.Streams == 0 {
		c.Streams = 4
	}
	if c.Deadline == 0 {
		c.Deadline = 10 * time.Second
	}
	if c.ReleaseTimeout == 0 {
		c.ReleaseTimeout = 2 * time.Second
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = 64
	}
	return c
}

// Stats describes a successful pull.
type Stats struct {
	// Bytes is the number of bytes pulled.
	Bytes int64
	// Duration is Open to Complete.
	Duration time.Duration
}

// Puller executes pulls over one Transport, reusing a connection per agent.
// Create it with NewPuller; it is safe for concurrent use.
type Puller struct {
	tr  Transport
	cfg PullerConfig

	mu    sync.Mutex
	conns map[string]Conn
	order []string
}

// NewPuller returns a Puller over tr.
func NewPuller(tr Transport, cfg PullerConfig) (*Puller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Puller{tr: tr, cfg: cfg.withDefaults(), conns: map[string]Conn{}}, nil
}

// Transport returns the puller's transport.
func (p *Puller) Transport() Transport { return p.tr }

// Pull copies src's blocks into dst (dst[i] receives src.BlockIDs[i] and must
// be src.BlockBytes long), all-or-nothing: it returns nil only when every
// block is in dst, verified (sizes, and checksums when src carries them and
// they are not skipped), and the remote hold is released (completed). On
// error dst is undefined and must not be handed to an engine; the caller
// frees it. The error wraps exactly one of the package's sentinels:
// ErrKVAborted when ctx ended, ErrKVDeadline past the deadline,
// ErrKVSourceGone, ErrKVNotHeld, ErrKVChecksum, ErrKVSize or ErrKVProtocol.
func (p *Puller) Pull(ctx context.Context, src Source, dst [][]byte) (Stats, error) {
	if src.Transport != p.tr.Name() {
		return Stats{}, fmt.Errorf("source served over %q, this puller speaks %q: %w", src.Transport, p.tr.Name(), ErrUnsupported)
	}
	if err := src.Validate(); err != nil {
		return Stats{}, fmt.Errorf("%w: %w", ErrKVProtocol, err)
	}
	if len(dst) != len(src.BlockIDs) {
		return Stats{}, fmt.Errorf("%d destination blocks for %d source blocks: %w", len(dst), len(src.BlockIDs), ErrKVSize)
	}
	for i, d := range dst {
		if len(d) != src.BlockBytes {
			return Stats{}, fmt.Errorf("destination block %d is %d bytes, source blocks %d: %w", i, len(d), src.BlockBytes, ErrKVSize)
		}
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, p.cfg.Deadline)
	defer cancel()
	conn, err := p.conn(dctx, src.Agent)
	if err != nil {
		return Stats{}, p.classify(ctx, dctx, err)
	}
	g, err := conn.Open(dctx, OpenRequest{EngineID: src.EngineID, RequestID: src.RequestID, BlockIDs: src.BlockIDs})
	if err == nil {
		err = p.transfer(dctx, conn, src, g, dst)
	}
	if err == nil {
		err = conn.Complete(dctx, g)
	}
	if err != nil {
		err = p.classify(ctx, dctx, err)
		if errors.Is(err, ErrKVSourceGone) {
			p.evict(src.Agent, conn)
		} else {
			p.release(conn, src.RequestID)
		}
		return Stats{}, err
	}
	return Stats{Bytes: src.Bytes(), Duration: time.Since(start)}, nil
}

// transfer checks the grant against the descriptor, reads every block over
// up to Streams parallel reads and verifies checksums.
func (p *Puller) transfer(ctx context.Context, conn Conn, src Source, g Grant, dst [][]byte) error {
	if g.BlockBytes != src.BlockBytes || len(g.BlockIDs) != len(src.BlockIDs) || g.NumTokens != src.NumTokens {
		return fmt.Errorf("grant has %d blocks of %d bytes for %d tokens, descriptor %d of %d for %d: %w",
			len(g.BlockIDs), g.BlockBytes, g.NumTokens, len(src.BlockIDs), src.BlockBytes, src.NumTokens, ErrKVSize)
	}
	sums := src.Checksums
	if p.cfg.SkipChecksums {
		sums = nil
	}
	n := len(dst)
	streams := min(p.cfg.Streams, n)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, streams)
	for s := range streams {
		lo, hi := s*n/streams, (s+1)*n/streams
		go func() {
			idx := make([]int, hi-lo)
			for k := range idx {
				idx[k] = lo + k
			}
			err := conn.Read(ctx, g, idx, dst[lo:hi])
			for i := lo; err == nil && i < hi && sums != nil; i++ {
				if c := Checksum(dst[i]); c != sums[i] {
					err = fmt.Errorf("block %d (remote id %d): crc64 %016x, source says %016x: %w", i, src.BlockIDs[i], c, sums[i], ErrKVChecksum)
				}
			}
			if err != nil {
				cancel()
			}
			errs <- err
		}()
	}
	var first error
	for range streams {
		if err := <-errs; err != nil && (first == nil || errors.Is(first, context.Canceled)) {
			first = err
		}
	}
	return first
}

// classify wraps err in exactly one sentinel, deciding by the contexts
// first: the caller's ended (aborted), or the pull's deadline passed.
func (p *Puller) classify(parent, dctx context.Context, err error) error {
	switch {
	case ended(parent):
		return fmt.Errorf("%w: %v", ErrKVAborted, err)
	case ended(dctx):
		return fmt.Errorf("%w (%v): %v", ErrKVDeadline, p.cfg.Deadline, err)
	}
	for _, s := range [...]error{ErrKVSourceGone, ErrKVNotHeld, ErrKVChecksum, ErrKVSize, ErrKVProtocol, ErrUnsupported} {
		if errors.Is(err, s) {
			return err
		}
	}
	return fmt.Errorf("%w: %w", ErrKVProtocol, err)
}

// ended reports whether ctx is done or its deadline has passed (a socket
// deadline set from ctx can fire a moment before ctx's own timer).
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// release gives the remote hold up after a failed pull, best effort.
func (p *Puller) release(conn Conn, requestID string) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ReleaseTimeout)
	defer cancel()
	_ = conn.Release(ctx, requestID)
}

// Release gives up a hold the caller will not pull (e.g. the client left
// after the prefill), best effort within ReleaseTimeout.
func (p *Puller) Release(ctx context.Context, src Source) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ReleaseTimeout)
	defer cancel()
	conn, err := p.conn(ctx, src.Agent)
	if err != nil {
		return err
	}
	return conn.Release(ctx, src.RequestID)
}

func (p *Puller) conn(ctx context.Context, addr string) (Conn, error) {
	p.mu.Lock()
	c, ok := p.conns[addr]
	p.mu.Unlock()
	if ok {
		return c, nil
	}
	c, err := p.tr.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if old, ok := p.conns[addr]; ok {
		p.mu.Unlock()
		_ = c.Close()
		return old, nil
	}
	var evicted Conn
	if len(p.order) >= p.cfg.MaxPeers {
		evicted = p.conns[p.order[0]]
		delete(p.conns, p.order[0])
		p.order = p.order[1:]
	}
	p.conns[addr] = c
	p.order = append(p.order, addr)
	p.mu.Unlock()
	if evicted != nil {
		_ = evicted.Close()
	}
	return c, nil
}

// evict drops a connection whose agent is gone, so the next pull redials.
func (p *Puller) evict(addr string, c Conn) {
	p.mu.Lock()
	if p.conns[addr] == c {
		delete(p.conns, addr)
		for i, a := range p.order {
			if a == addr {
				p.order = append(p.order[:i], p.order[i+1:]...)
				break
			}
		}
	} else {
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// Close closes every cached connection.
func (p *Puller) Close() error {
	p.mu.Lock()
	conns := p.conns
	p.conns, p.order = map[string]Conn{}, nil
	p.mu.Unlock()
	var errs []error
	for _, c := range conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Probe measures the path to the agent at addr over the cached connection:
// it reads filler into every block of dst (none: the transport's smallest
// round trip) and returns how long it took. The transport's Conn must be a
// Prober.
func (p *Puller) Probe(ctx context.Context, addr string, dst [][]byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Deadline)
	defer cancel()
	c, err := p.conn(ctx, addr)
	if err != nil {
		return 0, err
	}
	pr, ok := c.(Prober)
	if !ok {
		return 0, fmt.Errorf("%s connections cannot probe: %w", p.tr.Name(), ErrUnsupported)
	}
	start := time.Now()
	if err := pr.Probe(ctx, dst); err != nil {
		if errors.Is(err, ErrKVSourceGone) {
			p.evict(addr, c)
		}
		return 0, err
	}
	return time.Since(start), nil
}

// Conn returns the cached connection to the agent at addr, dialling it when
// there is none (for callers that ask a transport's Conn for an optional
// ability, e.g. kv-probe's report of the UCX lanes).
func (p *Puller) Conn(ctx context.Context, addr string) (Conn, error) { return p.conn(ctx, addr) }
