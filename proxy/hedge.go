package proxy

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// Hedged prefill (--prefill-hedge-after): a split never makes a request
// meaningfully slower than not splitting. When the prefill has not answered
// by the hedge point, the client's body is sent to the local engine too (a
// local prefill, as a fallback runs it), and the first to be ready wins:
// the prefill's answer (the decode leg then carries its KV, and the local
// request is aborted before it streamed anything), or the local request's
// first output (the prefill connection is closed, so the prefiller drops
// the request and frees its work, and the request is answered locally,
// mode="fallback", reason="slow_prefill"). A prefill that fails while its
// hedge runs uses the hedge as its fallback. Hedging is bounded by a token
// bucket (--prefill-hedge-budget, a share of split requests), so that under
// overload it cannot double the decode engine's work: a prefill past the
// hedge point with the budget spent waits as it would without hedging
// (hedges_denied_total). This is "The Tail at Scale"'s hedged request, and
// gRPC's hedging policy with its throttle, on the one leg that may be
// replaced by local work. Only sequential connectors hedge: a concurrent
// one has already sent its decode leg when the prefill runs.

// HedgeConfig is hedged prefill's configuration; the zero value is off.
type HedgeConfig struct {
	// After is the hedge point: a prefill not answered this long after it
	// was sent is raced by a local prefill. 0 turns hedging off, unless
	// Auto.
	After time.Duration
	// Auto sets the hedge point per prefiller to the 95th percentile of
	// its recent successful prefill times, never below After (or
	// HedgeAutoFloor when After is 0).
	Auto bool
	// Budget is the share of split requests that may be hedged (0..1), a
	// token bucket refilled by every split request.
	Budget float64
}

// HedgeAutoFloor is the lowest hedge point --prefill-hedge-after auto sets.
const HedgeAutoFloor = 50 * time.Millisecond

// hedgeAutoMinSamples is how many successful prefills a prefiller needs
// before auto sets its hedge point from them; before that, the samples of
// every prefiller together decide, and with fewer than that in all, no
// hedge is made.
const hedgeAutoMinSamples = 16

// hedgeWindow is how many recent prefill times auto keeps per prefiller.
const hedgeWindow = 128

// hedgeBurst is how many hedges the budget lets through back to back.
const hedgeBurst = 10

// On reports whether hedging is on.
func (c HedgeConfig) On() bool { return c.After > 0 || c.Auto }

// Validate reports the first invalid setting.
func (c HedgeConfig) Validate() error {
	switch {
	case c.After < 0:
		return fmt.Errorf("--prefill-hedge-after must be >= 0, got %v", c.After)
	case c.Budget < 0 || c.Budget > 1:
		return fmt.Errorf("--prefill-hedge-budget must be within 0..1, got %v", c.Budget)
	}
	return nil
}

// ReasonSlowPrefill: the prefill had not answered by the hedge point and
// the local prefill raced against it was ready first.
const ReasonSlowPrefill = split.ReasonSlowPrefill

// errHedgeLost is the cause a losing leg is cancelled with.
var errHedgeLost = split.ErrHedgeLost

// hedger is the proxy's hedging state: the budget and, for auto, the
// recent prefill times of each prefiller (by metric label: bounded).
type hedger struct {
	cfg HedgeConfig
	m   *metrics.Hedge

	mu     sync.Mutex
	tokens float64
	all    *prefillTimes
	by     map[string]*prefillTimes
}

func newHedger(cfg HedgeConfig, m *metrics.Hedge) *hedger {
	if !cfg.On() {
		return nil
	}
	h := &hedger{cfg: cfg, m: m, all: &prefillTimes{}, by: map[string]*prefillTimes{}}
	if cfg.Budget > 0 {
		h.tokens = hedgeBurst // a budget of 0 never hedges
	}
	return h
}

// prefillTimes is a ring of recent successful prefill times and the hedge
// point they give.
type prefillTimes struct {
	d     [hedgeWindow]time.Duration
	n     int // samples ever
	p95   time.Duration
	stale bool
}

func (t *prefillTimes) add(d time.Duration) {
	t.d[t.n%hedgeWindow] = d
	t.n++
	t.stale = true
}

// point is the 95th percentile of the samples, recomputed when new ones came.
func (t *prefillTimes) point() (time.Duration, bool) {
	if t.n < hedgeAutoMinSamples {
		return 0, false
	}
	if t.stale {
		s := slices.Clone(t.d[:min(t.n, hedgeWindow)])
		slices.Sort(s)
		t.p95, t.stale = s[len(s)*95/100], false
	}
	return t.p95, true
}

// split records a split request (it refills the budget) and returns its
// prefiller's hedge point; false: no hedge for it.
func (h *hedger) split(label string) (time.Duration, bool) {
	if h == nil {
		return 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tokens = min(h.tokens+h.cfg.Budget, hedgeBurst)
	if !h.cfg.Auto {
		return h.cfg.After, true
	}
	floor := max(h.cfg.After, HedgeAutoFloor)
	if t := h.by[label]; t != nil {
		if d, ok := t.point(); ok {
			return max(d, floor), true
		}
	}
	d, ok := h.all.point()
	return max(d, floor), ok
}

// take spends one hedge from the budget, reporting false (counted) when
// there is none left.
func (h *hedger) take() bool {
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

// observe records a successful prefill's duration for auto.
func (h *hedger) observe(label string, d time.Duration) {
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

// won counts a hedge's winner and the time its loser ran.
func (h *hedger) won(winner string, loserRan time.Duration) {
	loser := metrics.HedgeLocal
	if winner == metrics.HedgeLocal {
		loser = metrics.HedgeRemote
	}
	h.m.Hedges.WithLabelValues(winner).Inc()
	h.m.Wasted.WithLabelValues(loser).Add(loserRan.Seconds())
}

// hedgeable reports whether the request's prefill may be hedged: hedging
// is on and the split is the plain sequential one (a MoRI-IO write or the
// sidecar's own KV pull follow the prefill, and the local leg would have
// to undo them).
func (p *Proxy) hedgeable() bool {
	return p.hedge != nil && p.mori == nil && p.kv == nil
}

// localOutcome is what the local leg of a hedged request ends with.
type localOutcome struct {
	a   *heldAnswer
	err error
}

// hedgeWon counts a hedge's winner and the time its loser ran, and logs a
// prefill that answered first.
func (r *request) hedgeWon(winner string, loserRan time.Duration) {
	if winner == split.WinnerLocal {
		r.p.hedge.won(metrics.HedgeLocal, loserRan)
		return
	}
	r.p.hedge.won(metrics.HedgeRemote, loserRan)
	r.logAt(zerolog.InfoLevel).Msg("hedge: the prefill answered first; local prefill cancelled")
}
