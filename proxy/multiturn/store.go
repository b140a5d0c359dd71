package multiturn

import (
	"context"
	"crypto/sha256"
	"iter"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// Entry is what one decode answer left for the turn that extends it.
type Entry struct {
	// Seq is the digest of the sequence the decode engine saw and produced,
	// narrowed as the request was (Prompt.Narrow): the entry's key. Len is
	// the sequence's length in its units (messages for a chat, bytes of
	// text for a completion): a turn whose first Len units sum to Seq
	// extends it.
	Seq [sha256.Size]byte
	Len int
	// Params are the decode answer's kv_transfer_params as checked and
	// written anew (never the answer's bytes).
	Params []byte
	// Tokens is how many tokens of the sequence the decode engine holds.
	Tokens int
	// Pinned is when the decode engine lets those tokens go (the deadline
	// Pins counts them to; zero: not counted).
	Pinned time.Time
	// Prefiller and Model are the split's that left it: where and how a
	// release leg goes when no turn will read it.
	Prefiller, Model string
}

// size is what e costs the store, in bytes (its key and bookkeeping too).
func (e *Entry) size() int { return len(e.Params) + len(e.Prefiller) + len(e.Model) + entryOverhead }

// entryOverhead is an entry's fixed cost: its digest, links and map slot,
// and the narrowing's set it is in. Measured: 286 bytes of heap per entry
// when all share one narrowing (a pod-level session key), 443 when each
// has its own (a key per conversation); counted with room to spare.
const entryOverhead = 576

// Client names the client an entry was kept for, whose share it counts
// in: the address the request came from (the TCP peer), an IPv4-mapped
// one as its IPv4 address, an IPv6 one cut to its /64 (what one host is
// usually given, so that one host's addresses are one client). The zero
// Client stands for every request whose address is unknown.
type Client struct{ a netip.Addr }

// ClientOf is the Client of a request from address a.
func ClientOf(a netip.Addr) Client {
	a = a.Unmap()
	if a.Is6() {
		if p, err := a.Prefix(64); err == nil {
			a = p.Addr()
		}
	}
	return Client{a}
}

// StoreConfig is a Store's bounds.
type StoreConfig struct {
	// MaxEntries and MaxBytes bound the entries and what they cost.
	MaxEntries, MaxBytes int
	// ClientShare is the part of both bounds one client keeps whatever
	// the others do (0 < ClientShare ≤ 1; 0 is taken as 1): while the
	// store is full, a client that holds its share makes room from its
	// own oldest entries, and one under it from those of a client over
	// its share before anyone else's.
	ClientShare float64
	// TTL is how long an entry is kept.
	TTL time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Evictions counts the entries a Put dropped for room, by why.
type Evictions struct {
	// Share: the client that kept the new entry held its share; its own
	// oldest went.
	Share int
	// OverShare: the oldest of a client over its share went, for a
	// client under its own.
	OverShare int
	// Full: no client was over its share; the least recently kept went.
	Full int
	// The entries dropped, for room or replaced by the new one (their
	// pins will never be read): the first held here, so that a Put that
	// drops one allocates nothing for it.
	first Entry
	more  []Entry
	n     int
}

// drop records e as dropped.
func (ev *Evictions) drop(e Entry) {
	if ev.n == 0 {
		ev.first = e
	} else {
		ev.more = append(ev.more, e)
	}
	ev.n++
}

// Dropped yields the entries dropped, for room or replaced.
func (ev *Evictions) Dropped() iter.Seq[Entry] {
	return func(yield func(Entry) bool) {
		if ev.n == 0 || !yield(ev.first) {
			return
		}
		for _, e := range ev.more {
			if !yield(e) {
				return
			}
		}
	}
}

// Total is every entry dropped.
func (e Evictions) Total() int { return e.Share + e.OverShare + e.Full }

// Store keeps entries under their sequence's digest, bounded by entries
// and bytes, each for at most a TTL, and gives each out once: Take removes
// what it returns. No session key decides which entry a turn gets: a turn
// looks for the digests of its own prefixes (Prompt.Prefixes) at the
// lengths held under its narrowing (Lengths), and finds only an entry
// whose sequence it extends exactly. Each client has a share of the
// bounds no other client's entries can push its own out of
// (StoreConfig.ClientShare). Put, Take and Expire are O(1) per entry kept,
// looked at or dropped; Lengths is O(the distinct lengths held under the
// narrowing). Safe for concurrent use.
type Store struct {
	maxEntries, maxBytes     int
	shareEntries, shareBytes int
	ttl                      time.Duration
	now                      func() time.Time

	mu    sync.Mutex
	n     int
	bytes int
	// entries is every entry, the least recently kept first.
	entries chain[stored]
	index   map[[sha256.Size]byte]*stored
	narrows map[[sha256.Size]byte]*narrowed
	clients map[Client]*client
	// over is the clients over their share, in the order they went over.
	over  chain[client]
	spare []*client // clients with no entry left, for reuse
}

type stored struct {
	e       Entry
	expires time.Time
	owner   *client
	narrow  *narrowed
	// every is its place among all entries, mine among its owner's.
	every, mine links[stored]
}

// narrowed is the entries kept under one narrowing (Prompt.Narrow): how
// many there are, and how many of each length, so that a turn hashes its
// prefixes only at the lengths a history of its narrowing may have.
type narrowed struct {
	key [sha256.Size]byte
	n   int
	// lens is each length held and its entries, by length.
	lens []lenCount
}

// lenCount is the entries of one length.
type lenCount struct{ len, n int }

func byLen(lc lenCount, n int) int { return lc.len - n }

// client is one client's part of the store.
type client struct {
	key      Client
	n, bytes int
	// entries is its entries, the least recently kept first.
	entries chain[stored]
	// over: it holds more than its share, and is on the store's list of
	// those (overLinks).
	over      bool
	overLinks links[client]
}

// NewStore returns a store bounded as c says.
func NewStore(c StoreConfig) *Store {
	if c.Now == nil {
		c.Now = time.Now
	}
	share := c.ClientShare
	if share <= 0 || share > 1 {
		share = 1
	}
	return &Store{maxEntries: c.MaxEntries, maxBytes: c.MaxBytes, ttl: c.TTL, now: c.Now,
		shareEntries: max(1, int(share*float64(c.MaxEntries))), shareBytes: max(entryOverhead, int(share*float64(c.MaxBytes))),
		index: make(map[[sha256.Size]byte]*stored), narrows: make(map[[sha256.Size]byte]*narrowed),
		clients: make(map[Client]*client)}
}

// Put keeps e under its digest and narrowing narrow (Prompt.Narrow), kept
// for client from, in place of an entry of the same digest. When the
// bounds are reached, room is made from from's own oldest entries while it
// holds its share, else from the oldest of a client over its share, else
// from the least recently kept. It reports the entries dropped for room; ok
// is false for an entry larger than the byte bound, which is not kept.
func (s *Store) Put(narrow [sha256.Size]byte, from Client, e Entry) (ev Evictions, ok bool) {
	size := e.size()
	if size > s.maxBytes || s.maxEntries <= 0 {
		return ev, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.index[e.Seq]; ok {
		s.remove(st)
		ev.drop(st.e)
	}
	c := s.clients[from]
	for s.n >= s.maxEntries || s.bytes+size > s.maxBytes {
		var st *stored
		switch {
		case c != nil && (c.n >= s.shareEntries || c.bytes+size > s.shareBytes):
			st = c.entries.first
			ev.Share++
		case s.over.first != nil:
			st = s.over.first.entries.first
			ev.OverShare++
		default:
			st = s.entries.first
			ev.Full++
		}
		ev.drop(st.e)
		s.remove(st)
		if c != nil && c.n == 0 {
			c = nil // its last entry went, and it with it
		}
	}
	if c == nil {
		c = s.newClient(from)
	}
	ns := s.narrows[narrow]
	if ns == nil {
		ns = &narrowed{key: narrow}
		s.narrows[narrow] = ns
	}
	ns.n++
	if i, ok := slices.BinarySearchFunc(ns.lens, e.Len, byLen); ok {
		ns.lens[i].n++
	} else {
		ns.lens = slices.Insert(ns.lens, i, lenCount{e.Len, 1})
	}
	st := &stored{e: e, expires: s.now().Add(s.ttl), owner: c, narrow: ns}
	s.entries.push(st, everyEntry)
	c.entries.push(st, clientEntry)
	s.index[e.Seq] = st
	s.n++
	s.bytes += size
	c.n++
	c.bytes += size
	s.reshare(c)
	return ev, true
}

// Lengths returns the distinct lengths of the entries held under narrow
// that are shorter than below, ascending: the longest most of them.
// O(log of the distinct lengths held + most).
func (s *Store) Lengths(narrow [sha256.Size]byte, below, most int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns := s.narrows[narrow]
	if ns == nil {
		return nil
	}
	end, _ := slices.BinarySearchFunc(ns.lens, below, byLen)
	held := ns.lens[max(0, end-most):end]
	lens := make([]int, len(held))
	for i, lc := range held {
		lens[i] = lc.len
	}
	return lens
}

// Take removes the first entry of seqs (digests, the longest prefix's
// first) that is held and has not expired, and returns it; expired ones on
// the way go. With none, it returns why: metrics.MultiturnExpired when one had
// expired, metrics.MultiturnPrefixMismatch when the turn continues an earlier one
// (continues) and entries are held under narrow but it extends none of
// them (an edited or stripped history, another conversation's text under a
// session key), else metrics.MultiturnNoEntry.
func (s *Store) Take(narrow [sha256.Size]byte, seqs [][sha256.Size]byte, continues bool) (Entry, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, expired := s.now(), false
	for _, seq := range seqs {
		st, ok := s.index[seq]
		if !ok {
			continue
		}
		s.remove(st)
		if !now.Before(st.expires) {
			expired = true
			continue
		}
		return st.e, ""
	}
	switch {
	case expired:
		return Entry{}, metrics.MultiturnExpired
	case continues && s.narrows[narrow] != nil:
		return Entry{}, metrics.MultiturnPrefixMismatch
	}
	return Entry{}, metrics.MultiturnNoEntry
}

// Count returns the number of entries.
func (s *Store) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// Clients returns the number of clients that have entries.
func (s *Store) Clients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.clients)
}

// Bytes returns what the entries cost, in bytes.
func (s *Store) Bytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// Expire drops every entry past its TTL and returns how many went. The
// entries are in the order they were kept, all for the same TTL, so the
// oldest are the ones to go.
func (s *Store) Expire() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, n := s.now(), 0
	for s.entries.first != nil && !now.Before(s.entries.first.expires) {
		s.remove(s.entries.first)
		n++
	}
	return n
}

// Sweeper drops expired entries in the background, so that a conversation
// that never comes back costs nothing past its TTL.
type Sweeper struct {
	Store *Store
	// Every is how often (> 0).
	Every time.Duration
	// Held is set to the number of entries after each sweep (nil: none).
	Held interface{ Set(float64) }
	// Pins, when set, has its pins past their deadline dropped on each
	// sweep, and PinnedTokens set to what is left.
	Pins         *Pins
	PinnedTokens interface{ Set(float64) }
}

// Run sweeps until ctx ends.
func (w Sweeper) Run(ctx context.Context) {
	t := time.NewTicker(w.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Store.Expire()
			if w.Held != nil {
				w.Held.Set(float64(w.Store.Count()))
			}
			if w.Pins != nil && w.PinnedTokens != nil {
				w.PinnedTokens.Set(float64(w.Pins.Tokens()))
			}
		}
	}
}

// remove drops st; a client left with no entry goes.
func (s *Store) remove(st *stored) {
	c := st.owner
	s.entries.remove(st, everyEntry)
	c.entries.remove(st, clientEntry)
	ns := st.narrow
	if ns.n--; ns.n == 0 {
		delete(s.narrows, ns.key)
	} else if i, ok := slices.BinarySearchFunc(ns.lens, st.e.Len, byLen); ok {
		if ns.lens[i].n--; ns.lens[i].n == 0 {
			ns.lens = slices.Delete(ns.lens, i, i+1)
		}
	}
	st.owner, st.narrow = nil, nil
	delete(s.index, st.e.Seq)
	size := st.e.size()
	s.n--
	s.bytes -= size
	c.n--
	c.bytes -= size
	s.reshare(c)
	if c.n == 0 {
		delete(s.clients, c.key)
		*c = client{}
		s.spare = append(s.spare, c)
	}
}

// newClient adds client key, with no entry yet.
func (s *Store) newClient(key Client) *client {
	var c *client
	if n := len(s.spare); n > 0 {
		c, s.spare = s.spare[n-1], s.spare[:n-1]
	} else {
		c = &client{}
	}
	c.key = key
	s.clients[key] = c
	return c
}

// reshare puts c on the list of clients over their share, or takes it
// off, as its entries say.
func (s *Store) reshare(c *client) {
	over := c.n > s.shareEntries || c.bytes > s.shareBytes
	switch {
	case over && !c.over:
		c.over = true
		s.over.push(c, overShare)
	case !over && c.over:
		c.over = false
		s.over.remove(c, overShare)
	}
}
