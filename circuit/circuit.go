// Package circuit holds a per-prefiller circuit breaker: after a number of
// consecutive failures a prefiller is skipped for a cool-down (requests go
// straight to local prefill), then one probe request is let through
// (half-open); its success closes the circuit, its failure opens it again.
// A dead prefill pod thus costs a few timeouts, not one per request.
package circuit

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Result is what a request learned about the prefiller.
type Result uint8

// The results reported to a Ticket.
const (
	// Success: the prefiller answered (any answer that shows it alive).
	Success Result = iota
	// Failure: refused, reset, timed out or answered 5xx.
	Failure
	// Neutral: no verdict (the client left, the request was bad); a
	// half-open probe slot is released for the next request.
	Neutral
)

// State of one prefiller's circuit.
type State uint8

// The circuit states.
const (
	// Closed: requests flow.
	Closed State = iota
	// Open: requests are refused until the cool-down ends.
	Open
	// HalfOpen: one probe request is in flight.
	HalfOpen
)

// String names the state.
func (s State) String() string {
	switch s {
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "closed"
}

// Config tunes the breakers. Start from DefaultConfig.
type Config struct {
	// Failures is the number of consecutive failures that opens a circuit;
	// 0 disables the breaker.
	Failures int
	// Cooldown is how long an open circuit refuses requests before a probe.
	Cooldown time.Duration
	// MaxTracked bounds the prefillers tracked at once (their addresses come
	// from a client header); past it, closed circuits are forgotten first,
	// and an untracked prefiller is treated as closed.
	MaxTracked int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DefaultConfig returns 3 failures, a 5 s cool-down and 1024 prefillers.
func DefaultConfig() Config {
	return Config{Failures: 3, Cooldown: 5 * time.Second, MaxTracked: 1024}
}

// Validate reports the first invalid setting, as one line.
func (c Config) Validate() error {
	switch {
	case c.Failures < 0:
		return fmt.Errorf("--circuit-breaker-failures must be >= 0, got %d", c.Failures)
	case c.Failures > 0 && c.Cooldown <= 0:
		return fmt.Errorf("--circuit-breaker-cooldown must be > 0, got %v", c.Cooldown)
	case c.MaxTracked <= 0:
		return errors.New("circuit breaker: max tracked prefillers must be > 0")
	}
	return nil
}

type entry struct {
	state    State
	failures int
	openedAt time.Time
}

// Breakers is a bounded set of per-key circuit breakers, safe for
// concurrent use. Create it with New.
type Breakers struct {
	cfg Config
	now func() time.Time

	mu      sync.Mutex
	entries map[string]*entry
}

// New returns breakers with cfg (which must be valid).
func New(cfg Config) *Breakers {
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &Breakers{cfg: cfg, now: now, entries: make(map[string]*entry)}
}

// Ticket is one admitted request's slot; Done reports its result exactly
// once (later calls are ignored).
type Ticket struct {
	b     *Breakers
	key   string
	probe bool
	done  bool
}

// Allow reports whether a request may go to key now, and its ticket when
// it may. An open circuit whose cool-down ended admits one probe.
func (b *Breakers) Allow(key string) (*Ticket, bool) {
	if b == nil || b.cfg.Failures == 0 {
		return &Ticket{}, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil {
		return &Ticket{b: b, key: key}, true
	}
	switch e.state {
	case Open:
		if b.now().Sub(e.openedAt) < b.cfg.Cooldown {
			return nil, false
		}
		e.state = HalfOpen
		return &Ticket{b: b, key: key, probe: true}, true
	case HalfOpen:
		return nil, false
	}
	return &Ticket{b: b, key: key}, true
}

// Done reports the request's result.
func (t *Ticket) Done(r Result) {
	if t == nil || t.b == nil || t.done {
		return
	}
	t.done = true
	t.b.report(t.key, t.probe, r)
}

func (b *Breakers) report(key string, probe bool, r Result) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	switch r {
	case Success:
		if e != nil && (probe || e.state == Closed) {
			delete(b.entries, key) // closed with no failures: nothing to remember
		}
	case Neutral:
		if probe && e != nil && e.state == HalfOpen {
			e.state = Open // the next request probes at once
			e.openedAt = time.Time{}
		}
	case Failure:
		if e == nil {
			if !b.makeRoom() {
				return
			}
			e = &entry{}
			b.entries[key] = e
		}
		switch {
		case probe:
			e.state, e.openedAt = Open, b.now()
		case e.state == Closed:
			e.failures++
			if e.failures >= b.cfg.Failures {
				e.state, e.openedAt = Open, b.now()
			}
		}
	}
}

// makeRoom frees a slot when the set is full, forgetting a closed circuit;
// it reports false when every tracked circuit is open.
func (b *Breakers) makeRoom() bool {
	if len(b.entries) < b.cfg.MaxTracked {
		return true
	}
	for k, e := range b.entries {
		if e.state == Closed {
			delete(b.entries, k)
			return true
		}
	}
	return false
}

// State returns key's circuit state.
func (b *Breakers) State(key string) State {
	if b == nil {
		return Closed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil {
		return e.state
	}
	return Closed
}

// Len is the number of tracked prefillers (at most MaxTracked).
func (b *Breakers) Len() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.entries)
}
