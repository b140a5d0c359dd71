// Package hedge is hedged prefill's policy (--prefill-hedge-after): when
// to hedge a prefill and whether the budget lets it. It holds the
// configuration, the token bucket that bounds hedging to a share of split
// requests, and, for the automatic hedge point, each prefiller's recent
// successful prefill times; it counts the hedges made and denied and the
// time their losers ran. Racing the legs is the split machine's
// (split.Sequential) and its drivers'.
//
// Hedged prefill: a split never makes a request meaningfully slower than
// not splitting. When the prefill has not answered by the hedge point, the
// client's body is sent to the local engine too (a local prefill, as a
// fallback runs it), and the first to be ready wins: the prefill's answer
// (the decode leg then carries its KV, and the local request is aborted
// before it streamed anything), or the local request's first output (the
// prefill connection is closed, so the prefiller drops the request and
// frees its work, and the request is answered locally, mode="fallback",
// reason="slow_prefill"). A prefill that fails while its hedge runs uses
// the hedge as its fallback. Hedging is bounded by a token bucket
// (--prefill-hedge-budget, a share of split requests), so that under
// overload it cannot double the decode engine's work: a prefill past the
// hedge point with the budget spent waits as it would without hedging
// (hedges_denied_total). This is "The Tail at Scale"'s hedged request, and
// gRPC's hedging policy with its throttle, on the one leg that may be
// replaced by local work. Only sequential connectors hedge: a concurrent
// one has already sent its decode leg when the prefill runs.
package hedge

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// Config is hedged prefill's configuration; the zero value is off.
type Config struct {
	// After is the hedge point: a prefill not answered this long after it
	// was sent is raced by a local prefill. 0 turns hedging off, unless
	// Auto.
	After time.Duration
	// Auto sets the hedge point per prefiller to the 95th percentile of
	// its recent successful prefill times, never below After (or
	// AutoFloor when After is 0).
	Auto bool
	// Budget is the share of split requests that may be hedged (0..1), a
	// token bucket refilled by every split request.
	Budget float64
}

// AutoFloor is the lowest hedge point --prefill-hedge-after auto sets.
const AutoFloor = 50 * time.Millisecond

// autoMinSamples is how many successful prefills a prefiller needs
// before auto sets its hedge point from them; before that, the samples of
// every prefiller together decide, and with fewer than that in all, no
// hedge is made.
const autoMinSamples = 16

// window is how many recent prefill times auto keeps per prefiller.
const window = 128

// burst is how many hedges the budget lets through back to back.
const burst = 10

// On reports whether hedging is on.
func (c Config) On() bool { return c.After > 0 || c.Auto }

// Validate reports the first invalid setting.
func (c Config) Validate() error {
	switch {
	case c.After < 0:
		return fmt.Errorf("--prefill-hedge-after must be >= 0, got %v", c.After)
	case c.Budget < 0 || c.Budget > 1:
		return fmt.Errorf("--prefill-hedge-budget must be within 0..1, got %v", c.Budget)
	}
	return nil
}

// Policy is the proxy's hedging state: the budget and, for auto, the
// recent prefill times of each prefiller (by metric label: bounded). Safe
// for concurrent use. A nil *Policy is hedging off: Split reports no
// hedge and Observe does nothing.
type Policy struct {
	cfg Config
	m   *metrics.Hedge

	mu     sync.Mutex
	tokens float64
	all    *prefillTimes
	by     map[string]*prefillTimes
}

// New returns the policy of cfg, counted in m; nil when cfg is off.
func New(cfg Config, m *metrics.Hedge) *Policy {
	if !cfg.On() {
		return nil
	}
	h := &Policy{cfg: cfg, m: m, all: &prefillTimes{}, by: map[string]*prefillTimes{}}
	if cfg.Budget > 0 {
		h.tokens = burst // a budget of 0 never hedges
	}
	return h
}

// prefillTimes is a ring of recent successful prefill times and the hedge
// point they give.
type prefillTimes struct {
	d     [window]time.Duration
	n     int // samples ever
	p95   time.Duration
	stale bool
}

func (t *prefillTimes) add(d time.Duration) {
	t.d[t.n%window] = d
	t.n++
	t.stale = true
}

// point is the 95th percentile of the samples, recomputed when new ones came.
func (t *prefillTimes) point() (time.Duration, bool) {
	if t.n < autoMinSamples {
		return 0, false
	}
	if t.stale {
		s := slices.Clone(t.d[:min(t.n, window)])
		slices.Sort(s)
		t.p95, t.stale = s[len(s)*95/100], false
	}
	return t.p95, true
}

// Split records a split request (it refills the budget) and returns its
// prefiller's hedge point; false: no hedge for it.
func (h *Policy) Split(label string) (time.Duration, bool) {
	if h == nil {
		return 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tokens = min(h.tokens+h.cfg.Budget, burst)
	if !h.cfg.Auto {
		return h.cfg.After, true
	}
	floor := max(h.cfg.After, AutoFloor)
	if t := h.by[label]; t != nil {
		if d, ok := t.point(); ok {
			return max(d, floor), true
		}
	}
	d, ok := h.all.point()
	return max(d, floor), ok
}

// Take spends one hedge from the budget, reporting false (counted) when
// there is none left.
func (h *Policy) Take() bool {
	h.mu.Lock()
	ok := h.tokens >= 1
	if ok {
		h.tokens--
	}
	h.mu.Unlock()
	if !ok {
		h.m.Denied.Inc()
	}
	return ok
}

// Observe records a successful prefill's duration for auto.
func (h *Policy) Observe(label string, d time.Duration) {
	if h == nil || !h.cfg.Auto {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.by[label]
	if t == nil {
		t = &prefillTimes{}
		h.by[label] = t
	}
	t.add(d)
	h.all.add(d)
}

// Won counts a hedge's winner (metrics.HedgeLocal or metrics.HedgeRemote)
// and the time its loser ran.
func (h *Policy) Won(winner string, loserRan time.Duration) {
	loser := metrics.HedgeLocal
	if winner == metrics.HedgeLocal {
		loser = metrics.HedgeRemote
	}
	h.m.Hedges.WithLabelValues(winner).Inc()
	h.m.Wasted.WithLabelValues(loser).Add(loserRan.Seconds())
}
