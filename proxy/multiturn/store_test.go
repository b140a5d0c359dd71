package multiturn

import (
	"crypto/sha256"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/pd-sidecar/pd-sidecar/metrics"
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
	a, b, d := keyOf("a"), keyOf("b"), keyOf("d")
	tests := []struct {
		name string
		run  func(t *testing.T, s *Store)
	}{
		{"taken once", func(t *testing.T, s *Store) {
			ev, ok := put(s, a, anyone, entry(5))
			assert.True(t, ok)
			assert.Zero(t, ev.Total())
			e, miss := take(s, a)
			assert.Equal(t, "", miss)
			assert.Equal(t, 5, e.Tokens)
			_, miss = take(s, a)
			assert.Equal(t, metrics.MultiturnNoEntry, miss)
		}},
		{"expired", func(t *testing.T, s *Store) {
			put(s, a, anyone, entry(5))
			c.t = c.t.Add(time.Minute)
			_, miss := take(s, a)
			assert.Equal(t, metrics.MultiturnExpired, miss)
			assert.Equal(t, 0, s.Count())
		}},
		{"replaced by an entry of the same digest", func(t *testing.T, s *Store) {
			put(s, a, anyone, entry(5))
			put(s, a, anyone, entry(7))
			assert.Equal(t, 1, s.Count())
			e, _ := take(s, a)
			assert.Equal(t, 7, e.Tokens)
		}},
		{"entry bound: the oldest goes", func(t *testing.T, s *Store) {
			put(s, a, anyone, entry(1))
			put(s, b, anyone, entry(2))
			ev, _ := put(s, d, anyone, entry(3))
			assert.Equal(t, Evictions{Share: 1}, counts(ev), "one client, whose share is the whole store: its own oldest")
			_, miss := take(s, a)
			assert.Equal(t, metrics.MultiturnNoEntry, miss)
			_, miss = take(s, d)
			assert.Equal(t, "", miss)
		}},
		{"too large for the byte bound: not kept", func(t *testing.T, s *Store) {
			_, ok := put(s, a, anyone, Entry{Params: make([]byte, 4096)})
			assert.False(t, ok)
			assert.Equal(t, 0, s.Count())
		}},
		{"sweep drops only the expired", func(t *testing.T, s *Store) {
			put(s, a, anyone, entry(1))
			c.t = c.t.Add(20 * time.Second)
			put(s, b, anyone, entry(2))
			c.t = c.t.Add(15 * time.Second)
			assert.Equal(t, 1, s.Expire())
			assert.Equal(t, 1, s.Count())
			_, miss := take(s, b)
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

// keyOf is a digest named s.
func keyOf(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// put keeps e under key, as its own narrowing (as one conversation's
// session key would).
func put(s *Store, key [32]byte, from Client, e Entry) (Evictions, bool) {
	e.Seq = key
	return s.Put(key, from, e)
}

// take takes the entry put under key.
func take(s *Store, key [32]byte) (Entry, string) { return s.Take(key, [][32]byte{key}, true) }

// counts is ev's counts alone.
func counts(ev Evictions) Evictions {
	return Evictions{Share: ev.Share, OverShare: ev.OverShare, Full: ev.Full}
}

// anyone is a client of unknown address.
var anyone Client

// TestStoreFindsByContent: a turn looks for the digests of its prefixes
// under its narrowing and takes the first held (its longest): entries of
// other sequences under the same narrowing stay, and a miss says whether
// the narrowing held any (prefix_mismatch) or none (no_entry); an expired
// entry on the way goes, and a shorter one is still found.
func TestStoreFindsByContent(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	pod, other := keyOf("pod"), keyOf("other tenant")
	at := func(seq string, n, tokens int) Entry {
		return Entry{Seq: keyOf(seq), Len: n, Params: []byte(`{}`), Tokens: tokens}
	}
	tests := []struct {
		name string
		run  func(t *testing.T, s *Store)
	}{
		{"many conversations under one narrowing each find their own", func(t *testing.T, s *Store) {
			for i := range 32 {
				s.Put(pod, anyone, at(fmt.Sprint("conv", i), 2*i+2, i+100))
			}
			for i := range 32 {
				e, miss := s.Take(pod, [][32]byte{keyOf("unheld"), keyOf(fmt.Sprint("conv", i))}, true)
				require.Equal(t, "", miss)
				assert.Equal(t, i+100, e.Tokens)
			}
			assert.Equal(t, 0, s.Count())
		}},
		{"the first held digest wins; the others stay", func(t *testing.T, s *Store) {
			s.Put(pod, anyone, at("long", 5, 50))
			s.Put(pod, anyone, at("short", 3, 30))
			e, _ := s.Take(pod, [][32]byte{keyOf("long"), keyOf("short")}, true)
			assert.Equal(t, 50, e.Tokens)
			assert.Equal(t, 1, s.Count())
		}},
		{"a turn that extends nothing held: prefix_mismatch, and every entry stays", func(t *testing.T, s *Store) {
			s.Put(pod, anyone, at("a", 3, 30))
			_, miss := s.Take(pod, [][32]byte{keyOf("b")}, true)
			assert.Equal(t, metrics.MultiturnPrefixMismatch, miss)
			_, miss = s.Take(other, [][32]byte{keyOf("b")}, true)
			assert.Equal(t, metrics.MultiturnNoEntry, miss, "nothing held under the other narrowing")
			_, miss = s.Take(pod, [][32]byte{keyOf("b")}, false)
			assert.Equal(t, metrics.MultiturnNoEntry, miss, "a first turn")
			assert.Equal(t, 1, s.Count())
		}},
		{"an expired entry goes, a shorter live one is taken", func(t *testing.T, s *Store) {
			s.Put(pod, anyone, at("old", 5, 50))
			c.t = c.t.Add(40 * time.Second)
			s.Put(pod, anyone, at("new", 3, 30))
			c.t = c.t.Add(25 * time.Second)
			e, miss := s.Take(pod, [][32]byte{keyOf("old"), keyOf("new")}, true)
			assert.Equal(t, "", miss)
			assert.Equal(t, 30, e.Tokens)
			_, miss = s.Take(pod, [][32]byte{keyOf("old")}, true)
			assert.Equal(t, metrics.MultiturnNoEntry, miss)
		}},
		{"only expired: expired", func(t *testing.T, s *Store) {
			s.Put(pod, anyone, at("old", 5, 50))
			c.t = c.t.Add(time.Minute)
			_, miss := s.Take(pod, [][32]byte{keyOf("old")}, true)
			assert.Equal(t, metrics.MultiturnExpired, miss)
		}},
		{"lengths: distinct, below the turn's, the longest most", func(t *testing.T, s *Store) {
			for i, n := range []int{2, 4, 4, 6, 8, 10} {
				s.Put(pod, anyone, at(fmt.Sprint(i), n, 1))
			}
			s.Put(other, anyone, at("x", 7, 1))
			assert.Equal(t, []int{2, 4, 6, 8}, s.Lengths(pod, 10, 64))
			assert.Equal(t, []int{6, 8}, s.Lengths(pod, 9, 2))
			assert.Empty(t, s.Lengths(keyOf("none"), 10, 64))
			s.Take(pod, [][32]byte{keyOf("1")}, true)
			assert.Equal(t, []int{2, 4, 6, 8}, s.Lengths(pod, 10, 64), "one of two at 4 is left")
			s.Take(pod, [][32]byte{keyOf("2")}, true)
			assert.Equal(t, []int{2, 6, 8}, s.Lengths(pod, 10, 64))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c.t = time.Unix(1000, 0)
			tc.run(t, NewStore(StoreConfig{MaxEntries: 64, MaxBytes: 1 << 20, TTL: time.Minute, Now: c.now}))
		})
	}
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
	key := func(c string, i int) [32]byte { return keyOf(fmt.Sprint(c, i)) }
	tests := []struct {
		name string
		run  func(t *testing.T, s *Store)
	}{
		{"a flood evicts its own entries, never another client's", func(t *testing.T, s *Store) {
			put(s, key("v", 0), victim, entry(1))
			var ev Evictions
			for i := range 6000 {
				e, ok := put(s, key("f", i), flooder, entry(1))
				require.True(t, ok)
				e = counts(e)
				ev.Share += e.Share
				ev.OverShare += e.OverShare
				ev.Full += e.Full
			}
			_, miss := take(s, key("v", 0))
			assert.Equal(t, "", miss, "the victim's entry is still there")
			assert.Equal(t, Evictions{Share: 6000 - 7}, counts(ev), "the flood filled the free room (7 entries), then gave its own")
			_, miss = take(s, key("f", 5999))
			assert.Equal(t, "", miss, "the flood's newest is kept")
			_, miss = take(s, key("f", 0))
			assert.Equal(t, metrics.MultiturnNoEntry, miss, "the flood's oldest went")
		}},
		{"free room is anyone's until another client needs it", func(t *testing.T, s *Store) {
			for i := range 8 {
				put(s, key("f", i), flooder, entry(1))
			}
			assert.Equal(t, 8, s.Count(), "the flooder holds the whole store while no one else puts")
			ev, _ := put(s, key("v", 0), victim, entry(1))
			assert.Equal(t, Evictions{OverShare: 1}, counts(ev), "the victim, under its share, takes the flooder's oldest")
			_, miss := take(s, key("f", 0))
			assert.Equal(t, metrics.MultiturnNoEntry, miss)
			_, miss = take(s, key("f", 1))
			assert.Equal(t, "", miss, "the flooder's next oldest stays")
		}},
		{"clients at their share give their own; under it, the least recently kept goes", func(t *testing.T, s *Store) {
			for i := range 2 {
				put(s, key("f", i), flooder, entry(1))
				put(s, key("v", i), victim, entry(1))
				put(s, key("o", i), other, entry(1))
			}
			put(s, key("x", 0), ClientOf(netip.MustParseAddr("10.0.0.3")), entry(1))
			put(s, key("x", 1), ClientOf(netip.MustParseAddr("10.0.0.4")), entry(1))
			ev, _ := put(s, key("f", 2), flooder, entry(1))
			assert.Equal(t, Evictions{Share: 1}, counts(ev), "the flooder holds its share (2): its own oldest")
			_, miss := take(s, key("f", 0))
			assert.Equal(t, metrics.MultiturnNoEntry, miss)
			ev, _ = put(s, key("y", 0), ClientOf(netip.MustParseAddr("10.0.0.5")), entry(1))
			assert.Equal(t, Evictions{Full: 1}, counts(ev), "no client over its share: the least recently kept")
			_, miss = take(s, key("v", 0))
			assert.Equal(t, metrics.MultiturnNoEntry, miss, "the victim's first entry was the least recently kept")
		}},
		{"the byte bound is shared too", func(t *testing.T, s *Store) {
			big := Entry{Params: make([]byte, 3*entryOverhead), Tokens: 1, Len: 1}
			put(s, key("v", 0), victim, entry(1))
			for i := range 10 {
				put(s, key("f", i), flooder, big)
			}
			_, miss := take(s, key("v", 0))
			assert.Equal(t, "", miss, "large entries of one client push out only its own")
		}},
		{"one IPv6 /64 is one client, an IPv4-mapped address its IPv4 one", func(t *testing.T, s *Store) {
			assert.Equal(t, ClientOf(netip.MustParseAddr("2001:db8:1:2::1")), ClientOf(netip.MustParseAddr("2001:db8:1:2:ffff::9")))
			assert.NotEqual(t, ClientOf(netip.MustParseAddr("2001:db8:1:2::1")), ClientOf(netip.MustParseAddr("2001:db8:1:3::1")))
			assert.Equal(t, ClientOf(netip.MustParseAddr("10.0.0.1")), ClientOf(netip.MustParseAddr("::ffff:10.0.0.1")))
			put(s, key("v", 0), victim, entry(1))
			for i := range 100 {
				put(s, key("f", i), ClientOf(netip.MustParseAddr(fmt.Sprintf("2001:db8:1:2::%x", i+1))), entry(1))
			}
			assert.Equal(t, 2, s.Clients(), "the victim and the /64")
			_, miss := take(s, key("v", 0))
			assert.Equal(t, "", miss, "a host's many addresses are one client")
		}},
		{"a client whose entries went is forgotten", func(t *testing.T, s *Store) {
			put(s, key("v", 0), victim, entry(1))
			put(s, key("f", 0), flooder, entry(1))
			take(s, key("v", 0))
			assert.Equal(t, 1, s.Clients())
			take(s, key("f", 0))
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
		keys[i] = keyOf(fmt.Sprint(i))
	}
	clients := []Client{ClientOf(netip.MustParseAddr("10.0.0.1")), ClientOf(netip.MustParseAddr("10.0.0.2"))}
	pod := keyOf("pod")
	for i, k := range keys {
		e := entry(1)
		e.Seq = k
		s.Put(pod, clients[i%2], e)
	}
	i, e := 0, entry(1)
	allocs := testing.AllocsPerRun(1000, func() {
		e.Seq = keys[i%len(keys)]
		s.Put(pod, clients[i%2], e)
		i++
	})
	assert.LessOrEqual(t, allocs, 1.0)
}
