// Package circuit holds a per-prefiller circuit breaker: after a number of
// consecutive failures a prefiller is skipped for a cool-down (requests go
// straight to local prefill), then one probe request is let through
// (half-open); its success closes the circuit, its failure opens it again.
// A dead prefill pod thus costs a few timeouts, not one per request.
//
// An open circuit can also be probed from outside the request path (the
// proxy's prober connects to the prefiller): Probes lists the circuits worth
// a probe and Probed records what one found. A probe that found the
// prefiller back ends the cool-down at once, so the next request is the
// half-open trial without waiting for it.
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
	// Unreachable: a Failure where nothing answered the request: the
	// connection was refused, reset or closed first. A circuit opened by
	// one is what a connect probe can see end (Probes); after a timeout or
	// a 5xx the prefiller's port most likely accepted connections all along,
	// so a connect says nothing and only the cool-down's trial decides.
	Unreachable
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
	// ProbeInterval is how often the proxy's prober connects to the
	// prefillers whose circuit Probes lists (a connect that succeeds ends
	// the cool-down); 0: no probing, the cool-down alone decides.
	ProbeInterval time.Duration
	// MaxTracked bounds the prefillers tracked at once (their addresses come
	// from a client header); past it, closed circuits are forgotten first,
	// and an untracked prefiller is treated as closed.
	MaxTracked int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DefaultConfig returns 3 failures, a 5 s cool-down, a probe every 250 ms
// and 1024 prefillers.
func DefaultConfig() Config {
	return Config{Failures: 3, Cooldown: 5 * time.Second, ProbeInterval: 250 * time.Millisecond, MaxTracked: 1024}
}

// Validate reports the first invalid setting, as one line.
func (c Config) Validate() error {
	switch {
	case c.Failures < 0:
		return fmt.Errorf("--circuit-breaker-failures must be >= 0, got %d", c.Failures)
	case c.Failures > 0 && c.Cooldown <= 0:
		return fmt.Errorf("--circuit-breaker-cooldown must be > 0, got %v", c.Cooldown)
	case c.ProbeInterval < 0:
		return fmt.Errorf("--circuit-probe-interval must be >= 0, got %v", c.ProbeInterval)
	case c.MaxTracked <= 0:
		return errors.New("circuit breaker: max tracked prefillers must be > 0")
	}
	return nil
}

type entry struct {
	state    State
	failures int
	openedAt time.Time
	// unreachable: the failure that last opened the circuit was
	// Unreachable, so a connect probe can tell when it ends.
	unreachable bool
	// probeUp: a probe found the prefiller back since the circuit last
	// opened; the next request is admitted as the half-open trial.
	probeUp bool
	// distrusted: a trial admitted on a probe's word failed; probes are
	// not listed again until the circuit closes (the entry goes), so a
	// prefiller that accepts connections but fails requests gets one
	// extra trial per outage, not one per probe.
	distrusted bool
	// lastProbe is when a probe last reported on the circuit.
	lastProbe time.Time
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
		if !e.probeUp && b.now().Sub(e.openedAt) < b.cfg.Cooldown {
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
	case Failure, Unreachable:
		if e == nil {
			if !b.makeRoom() {
				return
			}
			e = &entry{}
			b.entries[key] = e
		}
		switch {
		case probe:
			e.state, e.openedAt, e.unreachable = Open, b.now(), r == Unreachable
			e.distrusted = e.distrusted || e.probeUp
			e.probeUp = false
		case e.state == Closed:
			e.failures++
			if e.failures >= b.cfg.Failures {
				e.state, e.openedAt, e.unreachable = Open, b.now(), r == Unreachable
			}
		}
	}
}

// probeable: the circuit is open, and a connect probe may end its
// cool-down.
func (e *entry) probeable() bool {
	return e.state == Open && e.unreachable && !e.probeUp && !e.distrusted
}

// Probes returns up to limit prefillers whose circuit is open and worth a
// connect probe: opened by an Unreachable failure, not found back by a
// probe already (its trial is pending), not distrusted. Map order picks
// which ones when more are open, so a later call may pick others.
func (b *Breakers) Probes(limit int) []string {
	if b == nil || b.cfg.Failures == 0 || limit <= 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var keys []string
	for k, e := range b.entries {
		if e.probeable() {
			keys = append(keys, k)
			if len(keys) == limit {
				break
			}
		}
	}
	return keys
}

// Probed records a probe of key: up means the prefiller accepted a
// connection. On an open circuit that Probes would list, up ends the
// cool-down: the next request is admitted as the half-open trial, whose
// result closes or reopens the circuit as a cool-down's trial does. It
// reports whether the circuit now admits that trial.
func (b *Breakers) Probed(key string, up bool) bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil || e.state != Open {
		return false
	}
	e.lastProbe = b.now()
	if up && e.unreachable && !e.distrusted {
		e.probeUp = true
	}
	return e.probeUp
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

// Info is what is known of one circuit.
type Info struct {
	State State
	// Probing: the circuit is open and listed by Probes.
	Probing bool
	// ProbeUp: a probe found the prefiller back; the next request is the
	// half-open trial.
	ProbeUp bool
	// LastProbe is when a probe last reported (zero: never since the
	// circuit was last closed).
	LastProbe time.Time
}

// Info returns what is known of key's circuit.
func (b *Breakers) Info(key string) Info {
	if b == nil {
		return Info{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil {
		return Info{}
	}
	return Info{
		State:     e.state,
		Probing:   e.probeable(),
		ProbeUp:   e.state == Open && e.probeUp,
		LastProbe: e.lastProbe,
	}
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
