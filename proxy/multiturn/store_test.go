package multiturn

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
			ev, ok := s.Put(a, anyone, entry(5))
			assert.True(t, ok)
			assert.Zero(t, ev.Total())
			e, miss := s.Take(a, always)
			assert.Equal(t, "", miss)
			assert.Equal(t, 5, e.Tokens)
			_, miss = s.Take(a, always)
			assert.Equal(t, ReasonNoEntry, miss)
		}},
		{"expired", func(t *testing.T, s *Store) {
			s.Put(a, anyone, entry(5))
			c.t = c.t.Add(time.Minute)
			_, miss := s.Take(a, always)
			assert.Equal(t, ReasonExpired, miss)
			assert.Equal(t, 0, s.Count())
		}},
		{"replaced by the session's next entry", func(t *testing.T, s *Store) {
			s.Put(a, anyone, entry(5))
			s.Put(a, anyone, entry(7))
			assert.Equal(t, 1, s.Count())
			e, _ := s.Take(a, always)
			assert.Equal(t, 7, e.Tokens)
		}},
		{"entry bound: the oldest goes", func(t *testing.T, s *Store) {
			s.Put(a, anyone, entry(1))
			s.Put(b, anyone, entry(2))
			ev, _ := s.Put(d, anyone, entry(3))
			assert.Equal(t, Evictions{Share: 1}, ev, "one client, whose share is the whole store: its own oldest")
			_, miss := s.Take(a, always)
			assert.Equal(t, ReasonNoEntry, miss)
			_, miss = s.Take(d, always)
			assert.Equal(t, "", miss)
		}},
		{"too large for the byte bound: not kept", func(t *testing.T, s *Store) {
			_, ok := s.Put(a, anyone, Entry{Params: make([]byte, 4096)})
			assert.False(t, ok)
			assert.Equal(t, 0, s.Count())
		}},
		{"sweep drops only the expired", func(t *testing.T, s *Store) {
			s.Put(a, anyone, entry(1))
			c.t = c.t.Add(20 * time.Second)
			s.Put(b, anyone, entry(2))
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
			tc.run(t, NewStore(StoreConfig{MaxEntries: 2, MaxBytes: 2*entryOverhead + 200, ClientShare: 1, TTL: 30 * time.Second, Now: c.now}))
		})
	}
}

func always(Entry) string { return "" }

// anyone is a client of unknown address.
var anyone Client

// TestStoreLeavesAnEntryItsTurnDoesNotExtend: a take the entry does not
// suit leaves it for the turn it belongs to.
func TestStoreLeavesAnEntryItsTurnDoesNotExtend(t *testing.T) {
	s := NewStore(StoreConfig{MaxEntries: 4, MaxBytes: 1 << 20, TTL: time.Minute})
	a := SessionKey("a")
	s.Put(a, anyone, entry(9))
	_, miss := s.Take(a, func(Entry) string { return ReasonPrefixMismatch })
	assert.Equal(t, ReasonPrefixMismatch, miss)
	e, miss := s.Take(a, always)
	assert.Equal(t, "", miss)
	assert.Equal(t, 9, e.Tokens)
}

// TestStoreClientShares: each client (an address; an IPv6 /64) keeps its
// share of the bounds whatever the others do. While the store is full, a
// client holding its share makes room from its own oldest entries; one
// under its share takes the oldest entry of a client over its own, and
// only when no client is over its share the least recently kept. Every
// eviction is counted by why.
func TestStoreClientShares(t *testing.T) {
	flooder := ClientOf(netip.MustParseAddr("10.0.0.66"))
	victim := ClientOf(netip.MustParseAddr("10.0.0.1"))
	other := ClientOf(netip.MustParseAddr("10.0.0.2"))
	key := func(c string, i int) [32]byte { return SessionKey(fmt.Sprint(c, i)) }
	tests := []struct {
		name string
		run  func(t *testing.T, s *Store)
	}{
		{"a flood evicts its own entries, never another client's", func(t *testing.T, s *Store) {
			s.Put(key("v", 0), victim, entry(1))
			var ev Evictions
			for i := range 6000 {
				e, ok := s.Put(key("f", i), flooder, entry(1))
				require.True(t, ok)
				ev.Share += e.Share
				ev.OverShare += e.OverShare
				ev.Full += e.Full
			}
			_, miss := s.Take(key("v", 0), always)
			assert.Equal(t, "", miss, "the victim's entry is still there")
			assert.Equal(t, Evictions{Share: 6000 - 7}, ev, "the flood filled the free room (7 entries), then gave its own")
			_, miss = s.Take(key("f", 5999), always)
			assert.Equal(t, "", miss, "the flood's newest is kept")
			_, miss = s.Take(key("f", 0), always)
			assert.Equal(t, ReasonNoEntry, miss, "the flood's oldest went")
		}},
		{"free room is anyone's until another client needs it", func(t *testing.T, s *Store) {
			for i := range 8 {
				s.Put(key("f", i), flooder, entry(1))
			}
			assert.Equal(t, 8, s.Count(), "the flooder holds the whole store while no one else puts")
			ev, _ := s.Put(key("v", 0), victim, entry(1))
			assert.Equal(t, Evictions{OverShare: 1}, ev, "the victim, under its share, takes the flooder's oldest")
			_, miss := s.Take(key("f", 0), always)
			assert.Equal(t, ReasonNoEntry, miss)
			_, miss = s.Take(key("f", 1), always)
			assert.Equal(t, "", miss, "the flooder's next oldest stays")
		}},
		{"clients at their share give their own; under it, the least recently kept goes", func(t *testing.T, s *Store) {
			for i := range 2 {
				s.Put(key("f", i), flooder, entry(1))
				s.Put(key("v", i), victim, entry(1))
				s.Put(key("o", i), other, entry(1))
			}
			s.Put(key("x", 0), ClientOf(netip.MustParseAddr("10.0.0.3")), entry(1))
			s.Put(key("x", 1), ClientOf(netip.MustParseAddr("10.0.0.4")), entry(1))
			ev, _ := s.Put(key("f", 2), flooder, entry(1))
			assert.Equal(t, Evictions{Share: 1}, ev, "the flooder holds its share (2): its own oldest")
			_, miss := s.Take(key("f", 0), always)
			assert.Equal(t, ReasonNoEntry, miss)
			ev, _ = s.Put(key("y", 0), ClientOf(netip.MustParseAddr("10.0.0.5")), entry(1))
			assert.Equal(t, Evictions{Full: 1}, ev, "no client over its share: the least recently kept")
			_, miss = s.Take(key("v", 0), always)
			assert.Equal(t, ReasonNoEntry, miss, "the victim's first entry was the least recently kept")
		}},
		{"the byte bound is shared too", func(t *testing.T, s *Store) {
			big := Entry{Params: make([]byte, 3*entryOverhead), Tokens: 1, Len: 1}
			s.Put(key("v", 0), victim, entry(1))
			for i := range 10 {
				s.Put(key("f", i), flooder, big)
			}
			_, miss := s.Take(key("v", 0), always)
			assert.Equal(t, "", miss, "large entries of one client push out only its own")
		}},
		{"one IPv6 /64 is one client, an IPv4-mapped address its IPv4 one", func(t *testing.T, s *Store) {
			assert.Equal(t, ClientOf(netip.MustParseAddr("2001:db8:1:2::1")), ClientOf(netip.MustParseAddr("2001:db8:1:2:ffff::9")))
			assert.NotEqual(t, ClientOf(netip.MustParseAddr("2001:db8:1:2::1")), ClientOf(netip.MustParseAddr("2001:db8:1:3::1")))
			assert.Equal(t, ClientOf(netip.MustParseAddr("10.0.0.1")), ClientOf(netip.MustParseAddr("::ffff:10.0.0.1")))
			s.Put(key("v", 0), victim, entry(1))
			for i := range 100 {
				s.Put(key("f", i), ClientOf(netip.MustParseAddr(fmt.Sprintf("2001:db8:1:2::%x", i+1))), entry(1))
			}
			assert.Equal(t, 2, s.Clients(), "the victim and the /64")
			_, miss := s.Take(key("v", 0), always)
			assert.Equal(t, "", miss, "a host's many addresses are one client")
		}},
		{"a client whose entries went is forgotten", func(t *testing.T, s *Store) {
			s.Put(key("v", 0), victim, entry(1))
			s.Put(key("f", 0), flooder, entry(1))
			s.Take(key("v", 0), always)
			assert.Equal(t, 1, s.Clients())
			s.Take(key("f", 0), always)
			assert.Equal(t, 0, s.Clients())
			assert.Equal(t, 0, s.Bytes())
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, NewStore(StoreConfig{MaxEntries: 8, MaxBytes: 8*entryOverhead + 8*64, ClientShare: 0.25, TTL: time.Minute}))
		})
	}
}

// TestStorePutAllocatesOnlyTheEntry: a Put that makes room allocates what
// a Put into an empty store does, the entry alone: the links are the
// entry's own, and a client whose entries went is reused.
func TestStorePutAllocatesOnlyTheEntry(t *testing.T) {
	s := NewStore(StoreConfig{MaxEntries: 64, MaxBytes: 1 << 20, ClientShare: 0.25, TTL: time.Minute})
	keys := make([][32]byte, 256)
	for i := range keys {
		keys[i] = SessionKey(fmt.Sprint(i))
	}
	clients := []Client{ClientOf(netip.MustParseAddr("10.0.0.1")), ClientOf(netip.MustParseAddr("10.0.0.2"))}
	for i, k := range keys {
		s.Put(k, clients[i%2], entry(1))
	}
	e := entry(1)
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		s.Put(keys[i%len(keys)], clients[i%2], e)
		i++
	})
	assert.LessOrEqual(t, allocs, 1.0)
}
