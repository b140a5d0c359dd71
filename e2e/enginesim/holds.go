package enginesim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrKVCacheFull is returned when no free blocks are left to hold a
// prefill's KV for a remote decoder.
var ErrKVCacheFull = errors.New("kv cache full")

// ErrNoSuchTransfer is returned when a pull names blocks that are not held
// (never produced, already pulled, or expired).
var ErrNoSuchTransfer = errors.New("no such kv transfer")

// hold is the KV of one prefill kept for a remote decoder.
type hold struct {
	requestID string
	room      uint64
	hasRoom   bool
	blockIDs  []int
	blocks    [][]byte
	checksums []uint64
	tokens    int
	corrupt   bool
	timer     *time.Timer
	// transferID is the Mooncake transfer (room is its key); "" otherwise.
	transferID string
	// p2p is the P2P pull kind it is served for ("prefill": held under a
	// kv_request_id; "source": prefix blocks, never stored); "" otherwise.
	p2p string
	// exported marks a hold handed to the kvtransfer agent (kvagent.go),
	// which owns its lease and ends it.
	exported bool
	// pinned marks a decode engine's pinned sequence (bidirectional.go):
	// only a history pull reads it.
	pinned bool
	// of is, for the view a history pull reads of some of a pin's blocks,
	// that pin: the pull releases it whole.
	of *hold
	// done is closed when the hold ends (pulled, released or expired); nil
	// for holds that nobody waits on.
	done chan struct{}
}

// holdStore owns the simulator's block ids: blocks held for remote decoders
// (with a lease) and the count of blocks in use by running requests.
type holdStore struct {
	mu      sync.Mutex
	total   int
	free    []int
	active  int
	byID    map[string]*hold
	rooms   map[uint64]*hold
	waiters map[uint64][]chan struct{}
	// changed is called, outside the lock, after every change with the
	// number of held blocks and the cache usage (0..1).
	changed func(held int, usage float64)
	// expired is called when a lease ends with blocks still held.
	expired func(h *hold)
}

func newHoldStore(total int, changed func(int, float64), expired func(*hold)) *holdStore {
	s := &holdStore{
		total: total, byID: map[string]*hold{}, rooms: map[uint64]*hold{},
		waiters: map[uint64][]chan struct{}{}, changed: changed, expired: expired,
	}
	s.free = make([]int, total)
	for i := range s.free {
		s.free[i] = total - 1 - i
	}
	return s
}

func (s *holdStore) stats() (int, float64) {
	held := s.total - len(s.free)
	used := held + s.active
	return held, min(1, float64(used)/float64(s.total))
}

func (s *holdStore) notify() {
	// Under the lock: two changes reporting out of order (a hold added and,
	// with a zero lease, expired at once) would leave the gauge stale.
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changed(s.stats())
}

// useActive adds n blocks in use by a running request (n < 0 returns them).
func (s *holdStore) useActive(n int) {
	s.mu.Lock()
	s.active += n
	s.mu.Unlock()
	s.notify()
}

// add holds h for lease, assigning block ids. lease <= 0 expires it at once.
func (s *holdStore) add(h *hold, lease time.Duration) error {
	s.mu.Lock()
	n := len(h.blocks)
	if n > len(s.free) {
		s.mu.Unlock()
		return fmt.Errorf("hold %d blocks for %s: %w", n, h.requestID, ErrKVCacheFull)
	}
	h.blockIDs = append([]int(nil), s.free[len(s.free)-n:]...)
	s.free = s.free[:len(s.free)-n]
	s.byID[h.requestID] = h
	if h.hasRoom {
		s.rooms[h.room] = h
		for _, w := range s.waiters[h.room] {
			close(w)
		}
		delete(s.waiters, h.room)
	}
	h.timer = time.AfterFunc(max(lease, 0), func() {
		if s.remove(h) {
			s.expired(h)
		}
	})
	s.mu.Unlock()
	s.notify()
	return nil
}

// get returns the hold for requestID without releasing it.
func (s *holdStore) get(requestID string) (*hold, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.byID[requestID]
	return h, ok
}

// waitRoom returns the hold registered for an SGLang bootstrap room, waiting
// until it appears or ctx ends.
func (s *holdStore) waitRoom(ctx context.Context, room uint64) (*hold, error) {
	s.mu.Lock()
	if h, ok := s.rooms[room]; ok {
		s.mu.Unlock()
		return h, nil
	}
	w := make(chan struct{})
	s.waiters[room] = append(s.waiters[room], w)
	s.mu.Unlock()
	select {
	case <-w:
		s.mu.Lock()
		defer s.mu.Unlock()
		if h, ok := s.rooms[room]; ok {
			return h, nil
		}
		return nil, fmt.Errorf("room %d: %w", room, ErrNoSuchTransfer)
	case <-ctx.Done():
		s.mu.Lock()
		ws := s.waiters[room]
		for i, x := range ws {
			if x == w {
				s.waiters[room] = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(s.waiters[room]) == 0 {
			delete(s.waiters, room)
		}
		s.mu.Unlock()
		return nil, fmt.Errorf("wait for room %d: %w", room, ctx.Err())
	}
}

// release frees h's blocks (a completed pull). It reports whether h was
// still held.
func (s *holdStore) release(h *hold) bool {
	h.timer.Stop()
	ok := s.remove(h)
	return ok
}

func (s *holdStore) remove(h *hold) bool {
	s.mu.Lock()
	cur, ok := s.byID[h.requestID]
	if !ok || cur != h {
		s.mu.Unlock()
		return false
	}
	delete(s.byID, h.requestID)
	if h.hasRoom && s.rooms[h.room] == h {
		delete(s.rooms, h.room)
	}
	s.free = append(s.free, h.blockIDs...)
	if h.done != nil {
		close(h.done)
	}
	s.mu.Unlock()
	s.notify()
	return true
}

// heldBlocks returns the number of blocks held for remote decoders.
func (s *holdStore) heldBlocks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total - len(s.free)
}
