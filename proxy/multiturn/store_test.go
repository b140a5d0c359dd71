package multiturn

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func entry(tokens int) Entry {
	return Entry{Params: []byte(`{"remote_num_tokens":1}`), Tokens: tokens, Len: 1}
}

// TestStoreBoundsAndTakes: an entry is given out once, not past its TTL,
// and the least recently kept go first when the entry or byte bound is
// reached; an entry over the byte bound is not kept.
func TestStoreBoundsAndTakes(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	a, b, d := SessionKey("a"), SessionKey("b"), SessionKey("d")
	tests := []struct {
		name string
		run  func(t *testing.T, s *Store)
	}{
		{"taken once", func(t *testing.T, s *Store) {
			assert.Equal(t, 0, s.Put(a, entry(5)))
			e, miss := s.Take(a, always)
			assert.Equal(t, "", miss)
			assert.Equal(t, 5, e.Tokens)
			_, miss = s.Take(a, always)
			assert.Equal(t, ReasonNoEntry, miss)
		}},
		{"expired", func(t *testing.T, s *Store) {
			s.Put(a, entry(5))
			c.t = c.t.Add(time.Minute)
			_, miss := s.Take(a, always)
			assert.Equal(t, ReasonExpired, miss)
			assert.Equal(t, 0, s.Count())
		}},
		{"replaced by the session's next entry", func(t *testing.T, s *Store) {
			s.Put(a, entry(5))
			s.Put(a, entry(7))
			assert.Equal(t, 1, s.Count())
			e, _ := s.Take(a, always)
			assert.Equal(t, 7, e.Tokens)
		}},
		{"entry bound: the oldest goes", func(t *testing.T, s *Store) {
			s.Put(a, entry(1))
			s.Put(b, entry(2))
			assert.Equal(t, 1, s.Put(d, entry(3)))
			_, miss := s.Take(a, always)
			assert.Equal(t, ReasonNoEntry, miss)
			_, miss = s.Take(d, always)
			assert.Equal(t, "", miss)
		}},
		{"too large for the byte bound: not kept", func(t *testing.T, s *Store) {
			assert.Equal(t, -1, s.Put(a, Entry{Params: make([]byte, 4096)}))
			assert.Equal(t, 0, s.Count())
		}},
		{"sweep drops only the expired", func(t *testing.T, s *Store) {
			s.Put(a, entry(1))
			c.t = c.t.Add(20 * time.Second)
			s.Put(b, entry(2))
			c.t = c.t.Add(15 * time.Second)
			assert.Equal(t, 1, s.Expire())
			assert.Equal(t, 1, s.Count())
			_, miss := s.Take(b, always)
			assert.Equal(t, "", miss)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c.t = time.Unix(1000, 0)
			tc.run(t, NewStore(2, 2*entryOverhead+200, 30*time.Second, c.now))
		})
	}
}

func always(Entry) string { return "" }

// TestStoreLeavesAnEntryItsTurnDoesNotExtend: a take the entry does not
// suit leaves it for the turn it belongs to.
func TestStoreLeavesAnEntryItsTurnDoesNotExtend(t *testing.T) {
	s := NewStore(4, 1<<20, time.Minute, nil)
	a := SessionKey("a")
	s.Put(a, entry(9))
	_, miss := s.Take(a, func(Entry) string { return ReasonPrefixMismatch })
	assert.Equal(t, ReasonPrefixMismatch, miss)
	e, miss := s.Take(a, always)
	assert.Equal(t, "", miss)
	assert.Equal(t, 9, e.Tokens)
}
