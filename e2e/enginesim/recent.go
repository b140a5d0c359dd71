package enginesim

import "sync"

// recent keeps the last limit items added, oldest first (the journal's
// requests received, the ledger's requests finished). Safe for concurrent
// use.
type recent[T any] struct {
	mu    sync.Mutex
	limit int
	items []T
}

func newRecent[T any](limit int) *recent[T] { return &recent[T]{limit: limit} }

// add keeps v, forgetting the oldest past the limit.
func (r *recent[T]) add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, v)
	if len(r.items) > r.limit {
		r.items = r.items[len(r.items)-r.limit:]
	}
}

// list returns a copy of the items, oldest first.
func (r *recent[T]) list() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T{}, r.items...)
}

// clear forgets every item.
func (r *recent[T]) clear() {
	r.mu.Lock()
	r.items = nil
	r.mu.Unlock()
}
