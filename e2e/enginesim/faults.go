package enginesim

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Faults is the fault-injection plan, set at start with --faults or at run
// time with POST /sim/faults (JSON, same field names) and cleared with
// DELETE /sim/faults. Every field is optional.
type Faults struct {
	// Refuse resets inference connections without answering.
	Refuse bool `json:"refuse,omitempty"`
	// Hang accepts inference requests and never answers (until the client
	// leaves).
	Hang bool `json:"hang,omitempty"`
	// Status answers inference requests with this HTTP status and an
	// OpenAI-style error body.
	Status int `json:"status,omitempty"`
	// DieAfterChunks cuts the connection after this many streamed events
	// (JSON answers: after half the body).
	DieAfterChunks int `json:"die_after_chunks,omitempty"`
	// LatencyMS is added before each inference request is served.
	LatencyMS int `json:"latency_ms,omitempty"`
	// HoldUntilSet holds each inference request until the plan is set
	// again or cleared (or its client leaves), then serves it under the
	// plan it arrived with: a delay a test ends when it has seen what it
	// waits for, instead of guessing a latency.
	HoldUntilSet bool `json:"hold_until_set,omitempty"`
	// AfterHeadMS holds a streamed answer this long after its head was
	// sent (counted as waiting), before it loads KV or makes a token (a
	// slow queue or first step).
	AfterHeadMS int `json:"after_head_ms,omitempty"`
	// DieAfterHead cuts a streamed answer's connection right after its
	// head, before any event.
	DieAfterHead bool `json:"die_after_head,omitempty"`
	// EOSFirstToken makes the first generated token EOS (finish "stop").
	EOSFirstToken bool `json:"eos_first_token,omitempty"`
	// EOSAfterTokens, when > 0, ends generation with EOS (finish "stop") at
	// output position EOSAfterTokens: after that many tokens of the
	// assistant message, a continued message's (continue.go) included.
	EOSAfterTokens int `json:"eos_after_tokens,omitempty"`
	// CorruptKV flips a byte of the KV a remote decoder pulls.
	CorruptKV bool `json:"corrupt_kv,omitempty"`
	// ExpireKV makes blocks held for remote decoders expire at once.
	ExpireKV bool `json:"expire_kv,omitempty"`
	// FailKVLoad makes a decode's KV pull fail.
	FailKVLoad bool `json:"fail_kv_load,omitempty"`
	// SlowShare (0..1) is the fraction of matching requests slowed by
	// SlowMS plus a uniform 0..SlowJitterMS, each request picked at random
	// (a slow prefill, for measuring hedged prefills). The delay comes
	// before the request queues for a slot or computes (counted as
	// waiting). A request the share does not pick is served as if the
	// slow fields were unset: when the plan holds nothing else, it counts
	// for neither Skip nor Times.
	SlowShare float64 `json:"slow_share,omitempty"`
	// SlowMS is the base delay of a slowed request.
	SlowMS int `json:"slow_ms,omitempty"`
	// SlowJitterMS adds a uniform 0..SlowJitterMS ms to each slowed
	// request's delay.
	SlowJitterMS int `json:"slow_jitter_ms,omitempty"`
	// SlowSeed seeds the picks and the jitter so a sequence of requests is
	// slowed the same way on every run; 0 draws a random seed. Setting the
	// plan restarts the sequence.
	SlowSeed uint64 `json:"slow_seed,omitempty"`
	// Only restricts the plan to "prefill" legs (do_remote_decode:true) or
	// "decode" legs (carrying remote KV params or an SGLang room); empty
	// means every inference request.
	Only string `json:"only,omitempty"`
	// Skip lets this many matching requests pass unfaulted before the plan
	// applies (then Times counts): Skip k fails the (k+1)th request.
	Skip int `json:"skip,omitempty"`
	// Times applies the plan to the next Times matching requests, then
	// clears it; 0 keeps it until cleared.
	Times int `json:"times,omitempty"`
}

// Validate checks field values.
func (f Faults) Validate() error {
	switch {
	case f.Status != 0 && (f.Status < 400 || f.Status > 599):
		return fmt.Errorf("%w: faults.status must be 4xx or 5xx, not %d", ErrInvalidConfig, f.Status)
	case f.Only != "" && f.Only != "prefill" && f.Only != "decode":
		return fmt.Errorf("%w: faults.only must be prefill or decode, not %q", ErrInvalidConfig, f.Only)
	case f.DieAfterChunks < 0 || f.LatencyMS < 0 || f.AfterHeadMS < 0 || f.Times < 0 || f.Skip < 0 || f.EOSAfterTokens < 0 ||
		f.SlowMS < 0 || f.SlowJitterMS < 0:
		return fmt.Errorf("%w: fault counts must not be negative", ErrInvalidConfig)
	case !(f.SlowShare >= 0 && f.SlowShare <= 1): // NaN too
		return fmt.Errorf("%w: faults.slow_share must be within 0..1, not %v", ErrInvalidConfig, f.SlowShare)
	case f.SlowShare > 0 && f.SlowMS == 0 && f.SlowJitterMS == 0:
		return fmt.Errorf("%w: faults.slow_share needs slow_ms or slow_jitter_ms", ErrInvalidConfig)
	case f.SlowShare == 0 && (f.SlowMS != 0 || f.SlowJitterMS != 0 || f.SlowSeed != 0):
		return fmt.Errorf("%w: faults.slow_ms, slow_jitter_ms and slow_seed need slow_share > 0", ErrInvalidConfig)
	}
	return nil
}

// withoutSlow is f with the slow-prefill fields cleared.
func (f Faults) withoutSlow() Faults {
	f.SlowShare, f.SlowMS, f.SlowJitterMS, f.SlowSeed = 0, 0, 0, 0
	return f
}

func (f Faults) latency() time.Duration { return time.Duration(f.LatencyMS) * time.Millisecond }

func (f Faults) afterHead() time.Duration { return time.Duration(f.AfterHeadMS) * time.Millisecond }

// legKind classifies an inference request for Faults.Only.
type legKind string

const (
	legLocal   legKind = ""
	legPrefill legKind = "prefill"
	legDecode  legKind = "decode"
)

// label names k in metrics: "prefill", "decode" or "local".
func (k legKind) label() string {
	if k == legLocal {
		return "local"
	}
	return string(k)
}

// applied is the part of a plan that applies to one request.
type applied struct {
	Faults
	// slowed marks a request the slow-prefill share picked; slow is its
	// drawn delay.
	slowed bool
	slow   time.Duration
	// held, with HoldUntilSet, is closed when the plan is set again.
	held <-chan struct{}
}

// faultBox holds the current plan; safe for concurrent use.
type faultBox struct {
	mu sync.Mutex
	f  Faults
	// changed is closed, and replaced, each time the plan is set.
	changed chan struct{}
	// rng draws the slow-prefill picks and jitter; reseeded by set.
	rng *rand.Rand
}

func (b *faultBox) set(f Faults) {
	b.mu.Lock()
	b.f = f
	b.rng = newSlowRand(f.SlowSeed)
	if b.changed != nil {
		close(b.changed)
	}
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// newSlowRand returns the generator of slow-prefill draws: seeded by seed,
// or at random when seed is 0.
func newSlowRand(seed uint64) *rand.Rand {
	if seed == 0 {
		seed = rand.Uint64()
	}
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// drawSlow decides whether one matching request is slowed under f and by
// how much: a pick with probability SlowShare, then SlowMS plus a uniform
// 0..SlowJitterMS ms. The draws are taken from r in that order, so a seed
// fixes the sequence.
func drawSlow(r *rand.Rand, f Faults) (bool, time.Duration) {
	if f.SlowShare <= 0 || r.Float64() >= f.SlowShare {
		return false, 0
	}
	ms := f.SlowMS
	if f.SlowJitterMS > 0 {
		ms += r.IntN(f.SlowJitterMS + 1)
	}
	return true, time.Duration(ms) * time.Millisecond
}

func (b *faultBox) get() Faults {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f
}

// take returns the faults that apply to one request of kind k, counting it
// against Skip and Times. The slow-prefill share is drawn first: a request
// it does not pick sees the plan without its slow fields, and when nothing
// else is left it is not a matching request (Skip and Times stay).
func (b *faultBox) take(k legKind) applied {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.f
	if f == (Faults{}) || (f.Only != "" && legKind(f.Only) != k) {
		return applied{}
	}
	var a applied
	if f.SlowShare > 0 {
		a.slowed, a.slow = drawSlow(b.rng, f)
		if !a.slowed {
			f = f.withoutSlow()
			if (Faults{Only: f.Only, Skip: f.Skip, Times: f.Times}) == f {
				return applied{} // nothing else to apply: not a match
			}
		}
	}
	if f.Skip > 0 {
		b.f.Skip--
		return applied{}
	}
	if f.Times > 0 {
		b.f.Times--
		if b.f.Times == 0 {
			b.f = Faults{}
		}
	}
	a.Faults = f
	if f.HoldUntilSet {
		a.held = b.changed
	}
	return a
}
