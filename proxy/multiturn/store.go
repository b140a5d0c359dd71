package multiturn

import (
	"container/list"
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// The reasons a turn's prefill carries no history (metrics.Multiturn*).
const (
	ReasonNoEntry        = metrics.MultiturnNoEntry
	ReasonExpired        = metrics.MultiturnExpired
	ReasonPrefixMismatch = metrics.MultiturnPrefixMismatch
	ReasonBelowThreshold = metrics.MultiturnBelowThreshold
	ReasonPullFailed     = metrics.MultiturnPullFailed
)

// Entry is what one conversation's last decode left for its next turn.
type Entry struct {
	// Seq is the digest of the sequence the decode engine saw and produced
	// (Sequence.Sum), and Len its length in the sequence's units (messages
	// for a chat, bytes of text for a completion): the next turn's must
	// extend it.
	Seq [sha256.Size]byte
	Len int
	// Params are the decode answer's kv_transfer_params as checked and
	// written anew (never the answer's bytes).
	Params []byte
	// Tokens is how many tokens of the sequence the decode engine holds.
	Tokens int
}

// size is what e costs the store, in bytes (its key and bookkeeping too).
func (e *Entry) size() int { return len(e.Params) + entryOverhead }

// entryOverhead is an entry's fixed cost: its key, digest, list element
// and map slot.
const entryOverhead = 256

// Store keeps one Entry per session, bounded by entries and bytes, each
// for at most a TTL, and gives it out once: Take removes what it returns.
// Session keys are kept as their SHA-256, never as given. Safe for
// concurrent use.
type Store struct {
	maxEntries, maxBytes int
	ttl                  time.Duration
	now                  func() time.Time

	mu    sync.Mutex
	bytes int
	lru   *list.List // of *stored, most recent first
	index map[[sha256.Size]byte]*list.Element
}

type stored struct {
	key     [sha256.Size]byte
	e       Entry
	expires time.Time
}

// NewStore returns a store of at most maxEntries entries and maxBytes
// bytes, each kept for ttl; now is the clock (nil: time.Now).
func NewStore(maxEntries, maxBytes int, ttl time.Duration, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{maxEntries: maxEntries, maxBytes: maxBytes, ttl: ttl, now: now,
		lru: list.New(), index: make(map[[sha256.Size]byte]*list.Element)}
}

// SessionKey is the store's key of a session key.
func SessionKey(session string) [sha256.Size]byte { return sha256.Sum256([]byte(session)) }

// Put keeps e for session, replacing what the session had; the least
// recently kept entries go when the bounds are reached. It reports the
// number of entries evicted for room (an entry larger than the byte
// bound is not kept: -1).
func (s *Store) Put(session [sha256.Size]byte, e Entry) int {
	if e.size() > s.maxBytes || s.maxEntries <= 0 {
		return -1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.index[session]; ok {
		s.remove(el)
	}
	evicted := 0
	for s.lru.Len() >= s.maxEntries || s.bytes+e.size() > s.maxBytes {
		s.remove(s.lru.Back())
		evicted++
	}
	st := &stored{key: session, e: e, expires: s.now().Add(s.ttl)}
	s.index[session] = s.lru.PushFront(st)
	s.bytes += e.size()
	return evicted
}

// Take removes session's entry and returns it, or the reason there is
// none to use (ReasonNoEntry, ReasonExpired, or what usable says): an
// entry usable refuses is left for the turn it belongs to, one it takes or
// one expired goes.
func (s *Store) Take(session [sha256.Size]byte, usable func(Entry) string) (Entry, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.index[session]
	if !ok {
		return Entry{}, ReasonNoEntry
	}
	st := el.Value.(*stored)
	if !s.now().Before(st.expires) {
		s.remove(el)
		return Entry{}, ReasonExpired
	}
	if why := usable(st.e); why != "" {
		return Entry{}, why
	}
	s.remove(el)
	return st.e, ""
}

// Count returns the number of entries.
func (s *Store) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lru.Len()
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
	for el := s.lru.Back(); el != nil && !now.Before(el.Value.(*stored).expires); el = s.lru.Back() {
		s.remove(el)
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
		}
	}
}

func (s *Store) remove(el *list.Element) {
	st := s.lru.Remove(el).(*stored)
	delete(s.index, st.key)
	s.bytes -= st.e.size()
}
