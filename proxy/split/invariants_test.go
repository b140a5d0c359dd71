package split_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// The invariant tests feed each machine every sequence of events, up to a
// length, from an alphabet that holds every event it takes (timers
// included, and stale ones: a timer fired after it was disarmed, a leg's
// end after it was cancelled), and check after every event what must hold
// whatever the order: no timer disarmed that is not armed, none left armed
// once the split is over, the prefill's bookkeeping and the breaker's
// report once each, one answer at most, no action once the request has
// its answer, and a paired decode never cancelled past its first output.

// sym is one event of an alphabet, named for the failure messages.
type sym struct {
	name string
	ev   split.Event
}

func legFailed(err error) split.Event { return split.Event{Kind: split.LegFailed, Err: err} }

var seqAlphabet = []sym{
	{"answered", answered(handoff)},
	{"answeredEOS", answered(eos)},
	{"failedUnreachable", failed(errUnreachable)},
	{"failedRejected", failed(errRejected)},
	{"firePrefill", fire(split.TimerPrefill)},
	{"fireBackoff", fire(split.TimerBackoff)},
	{"fireHedge", fire(split.TimerHedge)},
	{"hedgeReady", split.Event{Kind: split.HedgeReady}},
	{"hedgeFailed", split.Event{Kind: split.HedgeFailed, Err: errLocal}},
	{"legFailedKV", legFailed(split.Recoverable(errKVLoad))},
	{"legFailed", legFailed(errDecode)},
	{"clientGone", split.Event{Kind: split.ClientGone, Err: errClientGone}},
}

// seqTrack is what a sequential split did so far, from its actions.
type seqTrack struct {
	armed                                  [split.Timers]bool
	began, ended, breaker, degraded, hedge int
	hedgeOver, decode, fromPrefill, local  int
	relayed, answers                       int
}

// apply checks acts against what the split did before and records them.
func (k *seqTrack) apply(acts []split.Action) error {
	for _, a := range acts {
		prefilling := k.began == 1 && k.ended == 0
		switch a.Op {
		case split.Arm:
			if !prefilling {
				return fmt.Errorf("Arm %s outside the prefill", timerName(a.Timer))
			}
			k.armed[a.Timer] = true
		case split.Disarm:
			if !k.armed[a.Timer] {
				return fmt.Errorf("Disarm %s, not armed", timerName(a.Timer))
			}
			k.armed[a.Timer] = false
		case split.PrefillBegan:
			k.began++
		case split.SendPrefill, split.CancelPrefill, split.Retrying:
			if !prefilling {
				return fmt.Errorf("%s outside the prefill", opName(a.Op))
			}
		case split.PrefillEnded:
			if !prefilling {
				return fmt.Errorf("PrefillEnded without a prefill running")
			}
			for t, on := range k.armed {
				if on {
					return fmt.Errorf("PrefillEnded with %s armed", timerName(split.Timer(t)))
				}
			}
			k.ended++
		case split.BreakerDone:
			if k.ended != 1 {
				return fmt.Errorf("BreakerDone before the prefill ended")
			}
			k.breaker++
		case split.Degraded:
			k.degraded++
		case split.SendHedge:
			if !prefilling {
				return fmt.Errorf("SendHedge outside the prefill")
			}
			k.hedge++
		case split.DropHedge, split.RelayHedge:
			if k.hedge != 1 || k.hedgeOver != 0 {
				return fmt.Errorf("%s with no hedge running", opName(a.Op))
			}
			k.hedgeOver++
			if a.Op == split.RelayHedge {
				k.relayed++
			}
		case split.SendDecode, split.AnswerPrefill:
			if k.ended != 1 {
				return fmt.Errorf("%s before the prefill ended", opName(a.Op))
			}
			if a.Op == split.SendDecode {
				k.decode++
			} else {
				k.fromPrefill++
			}
		case split.SendLocal:
			k.local++
		case split.Fail, split.PassOn:
			k.answers++
		}
	}
	switch {
	case k.began > 1 || k.ended > 1 || k.breaker > 1:
		return fmt.Errorf("prefill bookkeeping repeated: began %d, ended %d, breaker %d", k.began, k.ended, k.breaker)
	case k.degraded > 1 || k.hedge > 1 || k.decode+k.fromPrefill > 1 || k.local > 1 || k.answers > 1:
		return fmt.Errorf("done twice: degraded %d, hedge %d, decode %d, from prefill %d, local %d, answers %d",
			k.degraded, k.hedge, k.decode, k.fromPrefill, k.local, k.answers)
	case k.relayed+k.local > 1:
		return fmt.Errorf("both the hedge and a local leg answer")
	}
	return nil
}

// walk feeds every sequence of alphabet, up to depth more events, to
// copies of m (as it is after path), checking each step with check.
func walk[M any](t *testing.T, m M, k seqTrackLike[M], path []string, depth int, alphabet []sym) {
	if depth == 0 {
		return
	}
	for _, s := range alphabet {
		m2, k2 := m, k.clone()
		p := append(path[:len(path):len(path)], s.name)
		if !k2.allowed(&m2, s.ev) {
			continue
		}
		if err := k2.step(&m2, s.ev); err != nil {
			t.Fatalf("%s: %v", strings.Join(p, ","), err)
		}
		walk(t, m2, k2, p, depth-1, alphabet)
	}
}

// seqTrackLike is a tracker of machine M: whether a driver may report an
// event now, and the step that feeds it and checks the actions.
type seqTrackLike[M any] interface {
	clone() seqTrackLike[M]
	allowed(*M, split.Event) bool
	step(*M, split.Event) error
}

// seqWalker tracks a sequential split.
type seqWalker struct{ seqTrack }

func (w *seqWalker) clone() seqTrackLike[split.Sequential]       { c := *w; return &c }
func (w *seqWalker) allowed(*split.Sequential, split.Event) bool { return true }
func (w *seqWalker) step(m *split.Sequential, ev split.Event) error {
	wasDone := m.Done()
	fired := ev.Kind == split.TimerFired && w.armed[ev.Timer]
	if fired {
		w.armed[ev.Timer] = false
	}
	acts := m.On(ev)
	switch {
	case wasDone && len(acts) > 0:
		return fmt.Errorf("actions after the answer: %v", describe(acts, nil))
	case ev.Kind == split.TimerFired && !fired && len(acts) > 0:
		return fmt.Errorf("a stale %s timer acted: %v", timerName(ev.Timer), describe(acts, nil))
	}
	if err := w.apply(acts); err != nil {
		return fmt.Errorf("%w (actions %v)", err, describe(acts, nil))
	}
	if m.Done() {
		for t, on := range w.armed {
			if on {
				return fmt.Errorf("over with %s armed", timerName(split.Timer(t)))
			}
		}
		if w.began == 1 && (w.ended != 1 || w.breaker != 1) {
			return fmt.Errorf("over with the prefill's bookkeeping open")
		}
	}
	return nil
}

func TestSequentialInvariantsInEveryOrder(t *testing.T) {
	const depth = 5
	for _, fallback := range []bool{true, false} {
		for _, retries := range []int{0, 1} {
			for _, start := range []split.Start{noHedge, hedgeOn, hedgeDry} {
				name := fmt.Sprintf("fallback=%v,retries=%d,hedge=%v", fallback, retries, start.HedgeAfter > 0 && start.TakeHedge())
				t.Run(name, func(t *testing.T) {
					c := &clock{t: time.Unix(0, 0)}
					m := split.NewSequential(split.Config{PrefillTimeout: time.Second, MaxRetries: retries,
						RetryBackoff: 10 * time.Millisecond, Fallback: fallback, Judge: judge, Now: c.now})
					w := &seqWalker{}
					if err := w.apply(m.Start(start)); err != nil {
						t.Fatal(err)
					}
					walk[split.Sequential](t, *m, w, nil, depth, seqAlphabet)
				})
			}
		}
	}
}

var pairedAlphabet = []sym{
	{"prefillAnswered", answered(handoff)},
	{"prefillFailed", failed(errUnreachable)},
	{"prefillRejected", failed(errRejected)},
	{"firstOutput", split.Event{Kind: split.FirstOutput}},
	{"decodeEnded", split.Event{Kind: split.DecodeEnded}},
	{"decodeFailedKV", split.Event{Kind: split.DecodeEnded, Err: split.Recoverable(errKVLoad)}},
	{"decodeFailed", split.Event{Kind: split.DecodeEnded, Err: errDecode}},
	{"fireKVWait", fire(split.TimerKVWait)},
	{"firePrefill", fire(split.TimerPrefill)},
	{"clientGone", split.Event{Kind: split.ClientGone, Err: errClientGone}},
}

// pairedWalker tracks a paired split: the driver reports each leg's end
// once, a first output only before the decode leg's end, and no clean end
// of a decode leg whose output it holds.
type pairedWalker struct {
	armed                                [split.Timers]bool
	prefillOver, decodeOver, output      bool
	committed, cancelled                 bool
	breaker, answers, abandons, releases int
}

func (w *pairedWalker) clone() seqTrackLike[split.Paired] { c := *w; return &c }
func (w *pairedWalker) allowed(m *split.Paired, ev split.Event) bool {
	switch ev.Kind {
	case split.PrefillAnswered, split.PrefillFailed:
		return !w.prefillOver
	case split.DecodeEnded:
		return !w.decodeOver && (ev.Err != nil || !m.Holding())
	case split.FirstOutput:
		return !w.decodeOver && !w.output
	}
	return true
}

func (w *pairedWalker) step(m *split.Paired, ev split.Event) error {
	fired := ev.Kind == split.TimerFired && w.armed[ev.Timer]
	if fired {
		w.armed[ev.Timer] = false
	}
	wasDone, wasHolding := m.Done(), m.Holding()
	switch ev.Kind {
	case split.PrefillAnswered, split.PrefillFailed:
		w.prefillOver = true
	case split.DecodeEnded:
		w.decodeOver = true
	case split.FirstOutput:
		w.output = true
		w.committed = !w.cancelled
	}
	acts := m.On(ev)
	if ev.Kind == split.TimerFired && !fired && len(acts) > 0 {
		return fmt.Errorf("a stale %s timer acted: %v", timerName(ev.Timer), describe(acts, nil))
	}
	for _, a := range acts {
		switch a.Op {
		case split.Arm:
			return fmt.Errorf("Arm after the start")
		case split.Disarm:
			if !w.armed[a.Timer] {
				return fmt.Errorf("Disarm %s, not armed", timerName(a.Timer))
			}
			w.armed[a.Timer] = false
		case split.CancelDecode:
			if w.committed || w.decodeOver || w.cancelled {
				return fmt.Errorf("CancelDecode past the decode's first output or end")
			}
			w.cancelled = true
		case split.CancelPrefill, split.AbandonPrefill:
			if w.prefillOver {
				return fmt.Errorf("%s after the prefill leg ended", opName(a.Op))
			}
			if a.Op == split.AbandonPrefill {
				w.abandons++
			}
		case split.BreakerDone:
			w.breaker++
		case split.ReleaseOutput:
			if !wasHolding {
				return fmt.Errorf("ReleaseOutput with nothing held")
			}
			w.releases++
		case split.Fail, split.PassOn, split.SendLocal:
			if wasDone {
				return fmt.Errorf("%s after the answer", opName(a.Op))
			}
			w.answers++
		}
	}
	switch {
	case w.breaker > 1 || w.answers > 1 || w.abandons > 1 || w.releases > 1:
		return fmt.Errorf("done twice: breaker %d, answers %d, abandons %d, releases %d (actions %v)",
			w.breaker, w.answers, w.abandons, w.releases, describe(acts, nil))
	case w.prefillOver && w.breaker != 1:
		return fmt.Errorf("the prefill leg ended unreported to the breaker")
	case w.decodeOver && !m.Done():
		return fmt.Errorf("the decode leg ended and the request has no answer")
	case w.decodeOver && m.Holding():
		return fmt.Errorf("the decode leg ended with its output held")
	}
	if w.prefillOver && w.decodeOver {
		for t, on := range w.armed {
			if on {
				return fmt.Errorf("both legs over with %s armed", timerName(split.Timer(t)))
			}
		}
	}
	return nil
}

func TestPairedInvariantsInEveryOrder(t *testing.T) {
	const depth = 6
	for _, fallback := range []bool{true, false} {
		for _, hold := range []bool{true, false} {
			t.Run(fmt.Sprintf("fallback=%v,hold=%v", fallback, hold), func(t *testing.T) {
				m := split.NewPaired(split.PairedConfig{PrefillTimeout: time.Second, KVWait: time.Second,
					HoldOutput: hold, Fallback: fallback, Judge: judge})
				w := &pairedWalker{}
				for _, a := range m.Start(split.PairedStart{}) {
					if a.Op == split.Arm {
						w.armed[a.Timer] = true
					}
				}
				walk[split.Paired](t, *m, w, nil, depth, pairedAlphabet)
			})
		}
	}
}
