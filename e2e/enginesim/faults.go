package enginesim

import (
	"fmt"
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
	case f.DieAfterChunks < 0 || f.LatencyMS < 0 || f.AfterHeadMS < 0 || f.Times < 0 || f.Skip < 0 || f.EOSAfterTokens < 0:
		return fmt.Errorf("%w: fault counts must not be negative", ErrInvalidConfig)
	}
	return nil
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

// faultBox holds the current plan; safe for concurrent use.
type faultBox struct {
	mu sync.Mutex
	f  Faults
}

func (b *faultBox) set(f Faults) {
	b.mu.Lock()
	b.f = f
	b.mu.Unlock()
}

func (b *faultBox) get() Faults {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f
}

// take returns the faults that apply to one request of kind k, counting it
// against Times.
func (b *faultBox) take(k legKind) Faults {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.f
	if f == (Faults{}) || (f.Only != "" && legKind(f.Only) != k) {
		return Faults{}
	}
	if f.Skip > 0 {
		b.f.Skip--
		return Faults{}
	}
	if f.Times > 0 {
		b.f.Times--
		if b.f.Times == 0 {
			b.f = Faults{}
		}
	}
	return f
}
