// Package status answers "is P/D disaggregation really operating?": it
// keeps recent-window counts of how inference requests ended (a ring of
// 10-second buckets fed by the proxy at each request's end), the last
// successful split and KV transfer, and per-prefiller health, and serves
// them as JSON on GET /debug/pd and as text for `pd-sidecar status`.
package status

import (
	"slices"
	"sync"
	"time"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
)

// BucketWidth is the time one bucket of the ring covers.
const BucketWidth = 10 * time.Second

// CircuitStates reports a prefiller's circuit-breaker state ("closed",
// "open", "half_open", "open (probing)", "open (probe up)") and when its
// open circuit was last probed (zero: not), keyed by the prefiller's metric
// label. It is implemented by the proxy's breaker where one is configured.
type CircuitStates interface {
	CircuitState(prefiller string) string
	CircuitLastProbe(prefiller string) time.Time
}

// WireState is what the sidecar learnt of the engines' wire: the local
// engine's version, and the prefill answers' undocumented members.
type WireState interface {
	Engine() (engine, version string)
	UnknownKVMembers() []string
}

// CircuitNA is shown for the circuit state when no breaker is wired.
const CircuitNA = "n/a"

// Options configure a Tracker. Start from the zero value.
type Options struct {
	// Connector is the --kv-connector name.
	Connector string
	// Transport names the KV handoff ("engine-pull", or the kvtransfer
	// transport of the sidecar connector).
	Transport string
	// Window is how far back the counts reach (default 5m, rounded up to
	// whole buckets).
	Window time.Duration
	// MaxPrefillers bounds the per-prefiller table (default 64; the least
	// recently seen entry is dropped past it).
	MaxPrefillers int
	// Circuits reports circuit states (nil: "n/a").
	Circuits CircuitStates
	// Wire reports what the sidecar learnt of the engines' wire (nil:
	// nothing shown).
	Wire WireState
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// bucket counts the requests that ended within one BucketWidth.
type bucket struct {
	start     time.Time // zero: unused
	modes     map[string]int
	reasons   map[string]int
	named     int            // requests that named a prefiller (and were not declined)
	declined  map[string]int // splits declined, by reason (not in named)
	failed    int            // answered >= 500 (or 499)
	kvMoved   int
	prefilled int
	outcomes  [numOutcomes]int // of the named requests: they sum to named
	chunked   int              // decodes run in chunks (--decode-chunk-size)
	chunks    int              // their chunk requests
	encoder   map[string]int   // encoder-stage outcomes
	history   map[string]int   // multi-turn KV reuse's outcomes
}

// The outcomes of a request that named a prefiller, one each.
const (
	// outcomeSplit: a decode ran on KV that moved from the prefiller.
	outcomeSplit = iota
	// outcomeNoHandoff: answered 2xx/3xx without a KV handoff: the
	// prefill's first token ended generation, or a decode-first engine
	// served it from its own cache.
	outcomeNoHandoff
	// outcomeFellBack: degraded to a local prefill, and answered.
	outcomeFellBack
	// outcomeRefused: answered 4xx (passed on from the prefiller, or
	// refused by the sidecar).
	outcomeRefused
	// outcomeFailed: answered 5xx, or the client left first.
	outcomeFailed
	numOutcomes
)

// outcomeOf is the slot of a report's outcome (RequestReport.Outcome, as
// the metrics count it).
func outcomeOf(r core.RequestReport) int {
	switch r.Outcome() {
	case metrics.OutcomeFailed:
		return outcomeFailed
	case metrics.OutcomeRefused:
		return outcomeRefused
	case metrics.OutcomeFallback:
		return outcomeFellBack
	case metrics.OutcomeSplit:
		return outcomeSplit
	}
	return outcomeNoHandoff
}

// prefillerStat is the recent picture of one prefiller.
type prefillerStat struct {
	lastSeen    time.Time
	lastSuccess time.Time
	lastFailure time.Time
	lastReason  string
	prefill     ring // recent prefill durations
	kv          ring // recent KV handoff durations
	splits      int
	fallbacks   int
}

// ring keeps the last len(v) durations.
type ring struct {
	v [32]time.Duration
	n int // total pushed
}

func (r *ring) push(d time.Duration) {
	r.v[r.n%len(r.v)] = d
	r.n++
}

func (r *ring) values() []time.Duration {
	n := min(r.n, len(r.v))
	out := slices.Clone(r.v[:n])
	slices.Sort(out)
	return out
}

// Tracker accumulates request reports. It implements core.Observer and is
// safe for concurrent use.
type Tracker struct {
	opts    Options
	started time.Time

	mu          sync.Mutex
	ring        []bucket
	lastSplit   time.Time
	lastKV      time.Time
	lastNamed   time.Time
	total       map[string]int // by mode, since start
	prefillers  map[string]*prefillerStat
	everNamed   int
	everSplit   int
	everKVMoved int
}

// New returns a Tracker.
func New(o Options) *Tracker {
	if o.Window <= 0 {
		o.Window = 5 * time.Minute
	}
	if o.MaxPrefillers <= 0 {
		o.MaxPrefillers = 64
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	n := int((o.Window + BucketWidth - 1) / BucketWidth)
	o.Window = time.Duration(n) * BucketWidth
	return &Tracker{
		opts:       o,
		started:    o.Now(),
		ring:       make([]bucket, n),
		total:      map[string]int{},
		prefillers: map[string]*prefillerStat{},
	}
}

// bucketFor returns the bucket for t, recycling a stale slot.
func (t *Tracker) bucketFor(now time.Time) *bucket {
	start := now.Truncate(BucketWidth)
	i := int(start.UnixNano()/int64(BucketWidth)) % len(t.ring)
	if i < 0 {
		i += len(t.ring)
	}
	b := &t.ring[i]
	if !b.start.Equal(start) {
		*b = bucket{start: start, modes: map[string]int{}, reasons: map[string]int{}, declined: map[string]int{}, encoder: map[string]int{}, history: map[string]int{}}
	}
	return b
}

// ObserveRequest implements core.Observer.
func (t *Tracker) ObserveRequest(r core.RequestReport) {
	now := t.opts.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.bucketFor(now)
	b.modes[r.Mode]++
	t.total[r.Mode]++
	if r.Reason != "" {
		b.reasons[r.Reason]++
	}
	if r.Status >= 500 || r.Status == 499 {
		b.failed++
	}
	if r.DecodeChunks > 0 {
		b.chunked++
		b.chunks += r.DecodeChunks
	}
	if r.History != "" {
		b.history[r.History]++
	}
	if r.Encoder != "" {
		b.encoder[r.Encoder]++
	}
	if r.Declined != "" {
		// Served locally by choice (a short prompt, a conversation the
		// decode engine holds): no outcome of a split, and nothing about
		// the prefiller's health.
		b.declined[r.Declined]++
		return
	}
	if r.Prefiller == "" && !r.NamedPrefiller {
		return
	}
	b.named++
	t.everNamed++
	t.lastNamed = now
	o := outcomeOf(r)
	b.outcomes[o]++
	if o == outcomeSplit {
		b.kvMoved++
		t.everSplit++
		t.everKVMoved++
		t.lastSplit, t.lastKV = now, now
	}
	if r.Prefiller == "" {
		return // a value naming no usable prefiller: no row of its own
	}
	ps := t.prefiller(r.Prefiller, now)
	if r.PrefillDuration > 0 {
		b.prefilled++
		ps.prefill.push(r.PrefillDuration)
	}
	if r.KVHandoffDuration > 0 {
		ps.kv.push(r.KVHandoffDuration)
	}
	switch o {
	case outcomeSplit:
		ps.splits++
		ps.lastSuccess = now
	case outcomeFellBack:
		ps.fallbacks++
		ps.lastFailure, ps.lastReason = now, r.Reason
	case outcomeFailed:
		ps.lastFailure = now
	}
}

// prefiller returns the stat of label, admitting it (and evicting the least
// recently seen one past the bound).
func (t *Tracker) prefiller(label string, now time.Time) *prefillerStat {
	ps, ok := t.prefillers[label]
	if !ok {
		if len(t.prefillers) >= t.opts.MaxPrefillers {
			var oldest string
			for k, v := range t.prefillers {
				if oldest == "" || v.lastSeen.Before(t.prefillers[oldest].lastSeen) {
					oldest = k
				}
			}
			delete(t.prefillers, oldest)
		}
		ps = &prefillerStat{}
		t.prefillers[label] = ps
	}
	ps.lastSeen = now
	return ps
}

var _ core.Observer = (*Tracker)(nil)
