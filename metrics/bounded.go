package metrics

import (
	"maps"
	"slices"
	"sync"
)

// Other is the label value that stands for every value past the bound.
const Other = "other"

// Bounded admits up to a fixed number of distinct label values and maps
// every later one to Other, so client-controlled values (the
// x-prefiller-host-port header) cannot grow metric cardinality or memory
// without bound. It is safe for concurrent use.
type Bounded struct {
	mu   sync.RWMutex
	max  int
	seen map[string]struct{}
}

// NewBounded returns a Bounded admitting max distinct values.
func NewBounded(max int) *Bounded {
	return &Bounded{max: max, seen: make(map[string]struct{}, max)}
}

// Label returns v if it was admitted (now or before), else Other.
func (b *Bounded) Label(v string) string {
	l, _ := b.Admit(v)
	return l
}

// Values returns the values admitted, sorted.
func (b *Bounded) Values() []string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Sorted(maps.Keys(b.seen))
}

// Admit is Label, and reports whether this call admitted v: true once per
// distinct value admitted.
func (b *Bounded) Admit(v string) (label string, first bool) {
	b.mu.RLock()
	_, ok := b.seen[v]
	b.mu.RUnlock()
	if ok {
		return v, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[v]; ok {
		return v, false
	}
	if len(b.seen) >= b.max {
		return Other, false
	}
	b.seen[v] = struct{}{}
	return v, true
}
