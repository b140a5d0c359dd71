package multiturn

import (
	"sync"
	"time"
)

// Pins estimates the tokens the decode engine holds pinned for next turns:
// a decode answer's kv_transfer_params say the engine pinned
// remote_num_tokens tokens, which it holds until decoder_kv_blocks_ttl
// passes (a fixed deadline from the answer) or a prefill reads them, and
// whether or not the sidecar kept the params: an answer not kept (tool
// calls, reasoning, refused), an entry evicted for room or expired in the
// store, a conversation that never comes back — each holds the engine's
// blocks until the deadline, and nothing the sidecar can send frees them
// (only the engine that reads a pin frees it, docs/features.md). So Pin
// counts every pin the answers announce, Release takes off one a prefill
// was given to read, and the rest go at their deadline.
//
// The deadlines are counted in buckets of a second on a ring as long as
// the TTL, so the memory is fixed whatever the traffic and every call is
// O(1) (or the seconds passed since the last, at most the ring's length).
// Safe for concurrent use.
type Pins struct {
	ttl, width time.Duration
	now        func() time.Time

	mu      sync.Mutex
	buckets []int64 // tokens by deadline, bucket b at b % len
	head    int64   // the oldest bucket still counted
	started bool
	total   int64
}

// NewPins returns a ledger of pins held for ttl (the decode engines'
// decoder_kv_blocks_ttl); now is the clock (nil: time.Now).
func NewPins(ttl time.Duration, now func() time.Time) *Pins {
	if now == nil {
		now = time.Now
	}
	const width = time.Second
	return &Pins{ttl: ttl, width: width, now: now, buckets: make([]int64, int(ttl/width)+2)}
}

// Pin counts tokens pinned now and returns their deadline.
func (p *Pins) Pin(tokens int) time.Time {
	now := p.now()
	deadline := now.Add(p.ttl)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.advance(now)
	b := p.bucket(deadline)
	p.buckets[b%int64(len(p.buckets))] += int64(tokens)
	p.total += int64(tokens)
	return deadline
}

// Release takes off tokens pinned to deadline (a prefill read them), unless
// they are already past it.
func (p *Pins) Release(deadline time.Time, tokens int) {
	if deadline.IsZero() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.advance(p.now())
	b := p.bucket(deadline)
	if b < p.head {
		return
	}
	i := b % int64(len(p.buckets))
	n := min(int64(tokens), p.buckets[i])
	p.buckets[i] -= n
	p.total -= n
}

// Tokens returns the tokens pinned now.
func (p *Pins) Tokens() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.advance(p.now())
	return p.total
}

// bucket is the number of deadline's bucket: the pins in bucket b end
// before the start of bucket b+1.
func (p *Pins) bucket(deadline time.Time) int64 {
	return (deadline.UnixNano() + int64(p.width) - 1) / int64(p.width)
}

// advance drops the buckets whose deadlines have passed at now.
func (p *Pins) advance(now time.Time) {
	cur := now.UnixNano() / int64(p.width) // bucket cur ends at or before now
	if !p.started {
		p.head, p.started = cur+1, true
		return
	}
	if cur-p.head >= int64(len(p.buckets)) {
		clear(p.buckets)
		p.total, p.head = 0, cur+1
		return
	}
	for ; p.head <= cur; p.head++ {
		i := p.head % int64(len(p.buckets))
		p.total -= p.buckets[i]
		p.buckets[i] = 0
	}
}
