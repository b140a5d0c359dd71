package enginesim

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestStore(total int) (*holdStore, *atomic.Int64, *atomic.Int64) {
	var held, expired atomic.Int64
	s := newHoldStore(total, func(h int, _ float64) { held.Store(int64(h)) }, func(*hold) { expired.Add(1) })
	return s, &held, &expired
}

func testHold(id string, n int) *hold {
	return &hold{requestID: id, blocks: make([][]byte, n), checksums: make([]uint64, n)}
}

func TestHoldReleasedByPull(t *testing.T) {
	s, held, expired := newTestStore(10)
	h := testHold("r1", 3)
	require.NoError(t, s.add(h, time.Hour))
	assert.Equal(t, int64(3), held.Load())
	assert.Len(t, h.blockIDs, 3)
	got, ok := s.get("r1")
	require.True(t, ok)
	assert.Same(t, h, got)
	assert.True(t, s.release(h))
	assert.False(t, s.release(h), "a second release is a no-op")
	assert.Equal(t, int64(0), held.Load())
	assert.Equal(t, int64(0), expired.Load())
	_, ok = s.get("r1")
	assert.False(t, ok)
}

func TestHoldExpiresAtLease(t *testing.T) {
	s, held, expired := newTestStore(10)
	require.NoError(t, s.add(testHold("r1", 4), 30*time.Millisecond))
	require.NoError(t, s.add(testHold("r2", 2), 0)) // expire_kv: at once
	require.Eventually(t, func() bool { return held.Load() == 0 }, 30*time.Second, 5*time.Millisecond)
	assert.Equal(t, int64(2), expired.Load())
	assert.Equal(t, 0, s.heldBlocks())
}

func TestHoldCacheFull(t *testing.T) {
	s, _, _ := newTestStore(4)
	require.NoError(t, s.add(testHold("a", 3), time.Hour))
	err := s.add(testHold("b", 2), time.Hour)
	require.ErrorIs(t, err, ErrKVCacheFull)
	require.NoError(t, s.add(testHold("c", 1), time.Hour))
}

func TestHoldBlockIDsAreDistinct(t *testing.T) {
	s, _, _ := newTestStore(8)
	a, b := testHold("a", 4), testHold("b", 4)
	require.NoError(t, s.add(a, time.Hour))
	require.NoError(t, s.add(b, time.Hour))
	seen := map[int]bool{}
	for _, id := range append(a.blockIDs, b.blockIDs...) {
		assert.False(t, seen[id], "block %d handed out twice", id)
		seen[id] = true
	}
	s.release(a)
	c := testHold("c", 4)
	require.NoError(t, s.add(c, time.Hour), "released blocks are reused")
}

func TestWaitRoom(t *testing.T) {
	s, _, _ := newTestStore(8)
	got := make(chan *hold, 1)
	go func() {
		h, err := s.waitRoom(context.Background(), 77)
		if err == nil {
			got <- h
		}
	}()
	require.Eventually(t, func() bool { // the waiter is waiting before the room comes
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.waiters[77]) == 1
	}, 30*time.Second, time.Millisecond)
	h := testHold("room-77", 2)
	h.room, h.hasRoom = 77, true
	require.NoError(t, s.add(h, time.Hour))
	select {
	case w := <-got:
		assert.Same(t, h, w)
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := s.waitRoom(ctx, 78)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	s.mu.Lock()
	assert.Empty(t, s.waiters, "a timed-out waiter is removed")
	s.mu.Unlock()
}
