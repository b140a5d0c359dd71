package enginesim

import (
	"container/list"
	"sync"
)

// prefixCache maps the chained hash of a full block to its fingerprint,
// evicting the least recently used entry past capacity. A hit means the
// engine need not recompute that block, exactly like vLLM's automatic prefix
// caching: prefill cost and cached_tokens follow from it.
type prefixCache struct {
	mu    sync.Mutex
	limit int
	items map[uint64]*list.Element
	lru   *list.List
}

type cacheEntry struct {
	hash, fp uint64
}

func newPrefixCache(limit int) *prefixCache {
	return &prefixCache{limit: limit, items: map[uint64]*list.Element{}, lru: list.New()}
}

// get returns the fingerprint cached for hash.
func (c *prefixCache) get(hash uint64) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[hash]
	if !ok {
		return 0, false
	}
	c.lru.MoveToFront(e)
	return e.Value.(cacheEntry).fp, true
}

// put records a computed full block.
func (c *prefixCache) put(hash, fp uint64) {
	if c.limit <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[hash]; ok {
		c.lru.MoveToFront(e)
		return
	}
	c.items[hash] = c.lru.PushFront(cacheEntry{hash: hash, fp: fp})
	for c.lru.Len() > c.limit {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.items, old.Value.(cacheEntry).hash)
	}
}

// len returns the number of cached blocks.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
