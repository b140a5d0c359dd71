package kvtransfer

import (
	"context"
	"fmt"
	"hash/crc64"
	"slices"
	"sync"
	"time"
)

// crcTable is CRC-64/ECMA, the checksum of Source.Checksums.
var crcTable = crc64.MakeTable(crc64.ECMA)

// Checksum is the CRC-64/ECMA of one block, as Source.Checksums carries it.
func Checksum(block []byte) uint64 { return crc64.Checksum(block, crcTable) }

// Release reasons, passed to AgentConfig.OnRelease.
const (
	// ReasonCompleted: a puller read every block and called Complete.
	ReasonCompleted = "completed"
	// ReasonReleased: a puller gave the hold up (Release), or the engine did
	// (Agent.Drop).
	ReasonReleased = "released"
	// ReasonExpired: the lease passed without a completed pull.
	ReasonExpired = "expired"
)

// HoldInfo describes a hold to OnRelease.
type HoldInfo struct {
	RequestID string
	Region    *Region
	BlockIDs  []int
}

// AgentConfig configures an Agent. Zero fields take the defaults noted.
type AgentConfig struct {
	// EngineID is the engine's id; Open requests naming another are refused.
	EngineID string
	// Lease is how long a hold lasts without an operation (default 30 s).
	Lease time.Duration
	// Bandwidth paces the bytes served by Read in bytes per second (0:
	// unpaced). For simulators and tests that need slow pulls.
	Bandwidth float64
	// OnRelease is called once per hold, outside the agent's lock, when the
	// hold ends; the engine may reuse the blocks from then on. May be nil.
	OnRelease func(h HoldInfo, reason string)
	// OnHeld is called, outside the lock, with the number of blocks held
	// after every change (the held-blocks gauge); calls never overlap, and
	// the last one carries the count as it is now, whatever order
	// concurrent changes reach it in. May be nil.
	OnHeld func(blocks int)
}

// Hold is a request's blocks offered to one puller.
type Hold struct {
	// RequestID names the hold; it must be unique among live holds.
	RequestID string
	// Region holds the blocks; it must be registered.
	Region *Region
	// BlockIDs are the blocks, in prompt order.
	BlockIDs []int
	// NumTokens is the number of prompt tokens in the blocks.
	NumTokens int
	// Checksums are the blocks' CRC-64 (optional, one per block).
	Checksums []uint64
	// Lease overrides AgentConfig.Lease for this hold when positive.
	Lease time.Duration
}

type hold struct {
	Hold
	timer   *time.Timer
	readers int
	ended   string // set when released while readers > 0
}

// Agent exports registered regions to pullers. Create it with NewAgent; it
// is safe for concurrent use.
type Agent struct {
	cfg     AgentConfig
	onHeld  sync.Mutex // serialises OnHeld calls (notify)
	mu      sync.Mutex
	regions []*Region
	holds   map[string]*hold
	held    int
}

// NewAgent returns an agent with no regions and no holds.
func NewAgent(cfg AgentConfig) *Agent {
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	return &Agent{cfg: cfg, holds: map[string]*hold{}}
}

// EngineID returns the configured engine id.
func (a *Agent) EngineID() string { return a.cfg.EngineID }

// Bandwidth returns the configured pacing (0: unpaced).
func (a *Agent) Bandwidth() float64 { return a.cfg.Bandwidth }

// Register makes r exportable. Register every region before Listen.
func (a *Agent) Register(r *Region) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !slices.Contains(a.regions, r) {
		a.regions = append(a.regions, r)
	}
}

// Regions returns the registered regions.
func (a *Agent) Regions() []*Region {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.regions)
}

// Hold starts holding h's blocks for one puller, for the configured lease.
// It returns the descriptor to hand out (without Agent and Transport, which
// the caller fills in from its Listener).
func (a *Agent) Hold(h Hold) (Source, error) {
	if h.RequestID == "" || len(h.BlockIDs) == 0 || h.Region == nil {
		return Source{}, fmt.Errorf("hold: request id, region and blocks are required: %w", ErrKVProtocol)
	}
	if len(h.Checksums) != 0 && len(h.Checksums) != len(h.BlockIDs) {
		return Source{}, fmt.Errorf("hold %s: %d checksums for %d blocks: %w", h.RequestID, len(h.Checksums), len(h.BlockIDs), ErrKVSize)
	}
	if _, err := h.Region.Blocks(h.BlockIDs); err != nil {
		return Source{}, fmt.Errorf("hold %s: %w", h.RequestID, err)
	}
	a.mu.Lock()
	if !slices.Contains(a.regions, h.Region) {
		a.mu.Unlock()
		return Source{}, fmt.Errorf("hold %s: region %s is not registered: %w", h.RequestID, h.Region.Name(), ErrKVProtocol)
	}
	if _, dup := a.holds[h.RequestID]; dup {
		a.mu.Unlock()
		return Source{}, fmt.Errorf("hold %s: already held: %w", h.RequestID, ErrKVProtocol)
	}
	x := &hold{Hold: h}
	x.BlockIDs = slices.Clone(h.BlockIDs)
	x.Checksums = slices.Clone(h.Checksums)
	if x.Lease <= 0 {
		x.Lease = a.cfg.Lease
	}
	x.timer = time.AfterFunc(x.Lease, func() { a.end(h.RequestID, x, ReasonExpired) })
	a.holds[h.RequestID] = x
	a.held += len(h.BlockIDs)
	a.mu.Unlock()
	a.notify()
	return Source{
		EngineID: a.cfg.EngineID, RequestID: h.RequestID, BlockIDs: slices.Clone(h.BlockIDs),
		BlockBytes: h.Region.BlockBytes(), NumTokens: h.NumTokens, Checksums: slices.Clone(h.Checksums),
		LeaseMS: x.Lease.Milliseconds(),
	}, nil
}

// HeldBlocks returns the number of blocks currently held.
func (a *Agent) HeldBlocks() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

// Drop ends a hold on the engine's behalf (reason released); it reports
// whether the hold existed.
func (a *Agent) Drop(requestID string) bool { return a.release(requestID, ReasonReleased) }

// Open checks req against the hold, renews the lease and returns the grant.
func (a *Agent) Open(req OpenRequest) (Grant, error) {
	if req.EngineID != a.cfg.EngineID {
		return Grant{}, fmt.Errorf("engine id %q is not this engine's: %w", req.EngineID, ErrKVNotHeld)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	h, ok := a.holds[req.RequestID]
	if !ok || h.ended != "" {
		return Grant{}, fmt.Errorf("request %q: %w", req.RequestID, ErrKVNotHeld)
	}
	if !slices.Equal(h.BlockIDs, req.BlockIDs) {
		return Grant{}, fmt.Errorf("request %q: block ids do not match the hold: %w", req.RequestID, ErrKVNotHeld)
	}
	h.timer.Reset(h.Lease)
	return Grant{
		RequestID: h.RequestID, BlockIDs: slices.Clone(h.BlockIDs), BlockBytes: h.Region.BlockBytes(),
		NumTokens: h.NumTokens, Checksums: slices.Clone(h.Checksums), Lease: h.Lease,
	}, nil
}

// Region returns the region of a live hold (for transports that read it
// one-sided and need its registration).
func (a *Agent) Region(requestID string) (*Region, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h, ok := a.holds[requestID]
	if !ok || h.ended != "" {
		return nil, fmt.Errorf("request %q: %w", requestID, ErrKVNotHeld)
	}
	return h.Region, nil
}

// Acquire returns the bytes of the blocks at positions idx of a live hold
// for a transport to send, and renews the lease. The hold cannot end until
// done is called (a release meanwhile is deferred to done). The slices
// alias the region: send them, do not keep them.
func (a *Agent) Acquire(requestID string, idx []int) (blocks [][]byte, done func(), err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h, ok := a.holds[requestID]
	if !ok || h.ended != "" {
		return nil, nil, fmt.Errorf("request %q: %w", requestID, ErrKVNotHeld)
	}
	blocks = make([][]byte, len(idx))
	for k, i := range idx {
		if i < 0 || i >= len(h.BlockIDs) {
			return nil, nil, fmt.Errorf("request %q: block index %d out of range: %w", requestID, i, ErrKVProtocol)
		}
		blocks[k], _ = h.Region.Block(h.BlockIDs[i])
	}
	h.readers++
	h.timer.Reset(h.Lease)
	var once sync.Once
	return blocks, func() { once.Do(func() { a.doneReading(requestID, h) }) }, nil
}

func (a *Agent) doneReading(id string, h *hold) {
	a.mu.Lock()
	h.readers--
	reason := ""
	if h.readers == 0 && h.ended != "" {
		reason = h.ended
	}
	a.mu.Unlock()
	if reason != "" {
		a.finish(id, h, reason)
	}
}

// Complete ends the hold after a successful pull (reason completed).
func (a *Agent) Complete(requestID string) error {
	if !a.release(requestID, ReasonCompleted) {
		return fmt.Errorf("complete %q: %w", requestID, ErrKVNotHeld)
	}
	return nil
}

// Release ends the hold for a puller that gives up (reason released). An
// unknown hold is not an error.
func (a *Agent) Release(requestID string) { a.release(requestID, ReasonReleased) }

func (a *Agent) release(id, reason string) bool {
	a.mu.Lock()
	h, ok := a.holds[id]
	a.mu.Unlock()
	if !ok {
		return false
	}
	return a.end(id, h, reason)
}

// end marks h ended; it is finished now, or when its last reader is done.
func (a *Agent) end(id string, h *hold, reason string) bool {
	a.mu.Lock()
	if cur, ok := a.holds[id]; !ok || cur != h || h.ended != "" {
		a.mu.Unlock()
		return false
	}
	h.ended = reason
	h.timer.Stop()
	readers := h.readers
	a.mu.Unlock()
	if readers == 0 {
		a.finish(id, h, reason)
	}
	return true
}

func (a *Agent) finish(id string, h *hold, reason string) {
	a.mu.Lock()
	if cur, ok := a.holds[id]; !ok || cur != h {
		a.mu.Unlock()
		return
	}
	delete(a.holds, id)
	a.held -= len(h.BlockIDs)
	a.mu.Unlock()
	a.notify()
	if a.cfg.OnRelease != nil {
		a.cfg.OnRelease(HoldInfo{RequestID: id, Region: h.Region, BlockIDs: h.BlockIDs}, reason)
	}
}

// notify tells OnHeld the count held now. The count is read inside the
// serialised call, not passed from the change: a hold added and, with a
// zero lease, expired at once could otherwise report 0 then the stale
// count, leaving the gauge wrong.
func (a *Agent) notify() {
	if a.cfg.OnHeld == nil {
		return
	}
	a.onHeld.Lock()
	defer a.onHeld.Unlock()
	a.cfg.OnHeld(a.HeldBlocks())
}

// Close ends every hold (reason released), e.g. at engine shutdown.
func (a *Agent) Close() {
	a.mu.Lock()
	ids := make([]string, 0, len(a.holds))
	for id := range a.holds {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	for _, id := range ids {
		a.release(id, ReasonReleased)
	}
}

// pace sleeps so that sent bytes since start do not exceed bw bytes/s.
func pace(ctx context.Context, bw float64, start time.Time, sent int64) error {
	if bw <= 0 {
		return nil
	}
	due := time.Duration(float64(sent) / bw * float64(time.Second))
	wait := due - time.Since(start)
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
