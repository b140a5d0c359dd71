package split_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// Failures as the proxy's classifier sees them.
var (
	errUnreachable = errors.New("prefiller unreachable")
	errServer      = errors.New("prefiller 5xx")
	errRejected    = errors.New("prefiller 4xx")
	errBadRequest  = errors.New("bad request")
	errKVLoad      = errors.New("kv load failed")
	errInvalid     = errors.New("invalid kv params")
	errClientGone  = errors.New("client gone")
	errCircuitOpen = errors.New("circuit open")
	errDecode      = errors.New("decode engine failed")
	errLocal       = errors.New("local leg failed")
	errHistory     = fmt.Errorf("prefill with a history: %w", errServer)
)

func judge(err error) split.Verdict {
	switch {
	case err == errHistory:
		return split.Verdict{Reason: "server_error", Retry: true, Plain: true}
	case errors.Is(err, split.ErrPrefillTimeout): // before what it wraps, as the proxy's classifier
		return split.Verdict{Reason: "timeout"}
	case errors.Is(err, errUnreachable):
		return split.Verdict{Reason: "unreachable", Retry: true}
	case errors.Is(err, errServer):
		return split.Verdict{Reason: "server_error", Retry: true}
	case errors.Is(err, errRejected):
		return split.Verdict{Rejected: true}
	case errors.Is(err, split.ErrTPMismatch):
		return split.Verdict{Reason: "tp_mismatch"}
	case errors.Is(err, errKVLoad):
		return split.Verdict{Reason: "kv_load_failed"}
	case errors.Is(err, errInvalid):
		return split.Verdict{Reason: "invalid_kv_params"}
	case errors.Is(err, errCircuitOpen):
		return split.Verdict{Reason: "circuit_open"}
	}
	return split.Verdict{}
}

// clock is a settable time.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// step is one event and the operations it must produce, in order; each
// op may carry what it must say ("Fail:timeout" checks that the error's
// text holds "timeout"; "Arm:hedge" the timer; "Degraded:unreachable" the
// reason; "HedgeWon:local" the winner).
type step struct {
	ev      split.Event
	advance time.Duration // the clock moves first
	want    []string
}

func fire(t split.Timer) split.Event { return split.Event{Kind: split.TimerFired, Timer: t} }
func failed(err error) split.Event   { return split.Event{Kind: split.PrefillFailed, Err: err} }
func answered(h connectors.Handoff) split.Event {
	return split.Event{Kind: split.PrefillAnswered, Handoff: h}
}

var (
	handoff   = connectors.Handoff{Params: []byte(`{"remote_engine_id":"p"}`), TPSize: 1}
	eos       = connectors.Handoff{Done: true}
	bigTP     = connectors.Handoff{Params: []byte(`{}`), TPSize: 8}
	hedgeOn   = split.Start{HedgeAfter: 300 * time.Millisecond, TakeHedge: func() bool { return true }}
	hedgeDry  = split.Start{HedgeAfter: 300 * time.Millisecond, TakeHedge: func() bool { return false }}
	noHedge   = split.Start{}
	startOps  = []string{"PrefillBegan", "Arm:prefill", "SendPrefill"}
	hedgeOps  = []string{"PrefillBegan", "Arm:prefill", "SendPrefill", "Arm:hedge"}
	endOK     = []string{"Disarm:prefill", "PrefillEnded", "BreakerDone"}
	endHedged = []string{"Disarm:prefill", "Disarm:hedge", "PrefillEnded", "BreakerDone"}
)

func cat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestSequentialEventOrders(t *testing.T) {
	cases := []struct {
		name     string
		fallback bool // --prefill-fallback (default true)
		retries  int
		start    split.Start
		startOps []string
		steps    []step
		done     bool
	}{
		{name: "answered: decode", start: noHedge, startOps: startOps,
			steps: []step{{ev: answered(handoff), want: cat(endOK, []string{"SendDecode"})}}},
		{name: "answered EOS: answer from the prefill", start: noHedge, startOps: startOps,
			steps: []step{{ev: answered(eos), want: cat(endOK, []string{"AnswerPrefill"})}}},
		{name: "answer from the prefill fails: fallback", start: noHedge, startOps: startOps,
			steps: []step{
				{ev: answered(eos), want: cat(endOK, []string{"AnswerPrefill"})},
				{ev: split.Event{Kind: split.LegFailed, Err: errInvalid}, want: []string{"Degraded:invalid_kv_params", "SendLocal"}},
			}},
		{name: "decode leg fails unmarked: answered", start: noHedge, startOps: startOps,
			steps: []step{
				{ev: answered(handoff), want: cat(endOK, []string{"SendDecode"})},
				{ev: split.Event{Kind: split.LegFailed, Err: errInvalid}, want: []string{"Fail:invalid kv params"}},
			}, done: true},
		{name: "tp guard: fallback", start: noHedge, startOps: startOps, fallback: true,
			steps: []step{{ev: answered(bigTP), want: cat(endOK, []string{"Degraded:tp_mismatch", "SendLocal"})}}},
		{name: "circuit open: fallback without a prefill", start: split.Start{NoPrefill: errCircuitOpen},
			startOps: []string{"Degraded:circuit_open", "SendLocal"}},
		{name: "unreachable, no retries: fallback", start: noHedge, startOps: startOps,
			steps: []step{{ev: failed(errUnreachable), want: cat(endOK, []string{"Degraded:unreachable", "SendLocal"})}}},
		{name: "unreachable, no fallback: answered", start: noHedge, startOps: startOps, fallback: false,
			steps: []step{{ev: failed(errUnreachable), want: cat(endOK, []string{"Fail:unreachable"})}}, done: true},
		{name: "bad request: answered, no fallback", start: noHedge, startOps: startOps,
			steps: []step{{ev: failed(errBadRequest), want: cat(endOK, []string{"Fail:bad request"})}}, done: true},
		{name: "rejected: passed on", start: noHedge, startOps: startOps,
			steps: []step{{ev: failed(errRejected), want: cat(endOK, []string{"PassOn"})}}, done: true},
		{name: "retry then answer", start: noHedge, startOps: startOps, retries: 2,
			steps: []step{
				{ev: failed(errServer), want: []string{"Retrying:1", "Arm:backoff"}},
				{ev: fire(split.TimerBackoff), want: []string{"SendPrefill:1"}},
				{ev: failed(errUnreachable), want: []string{"Retrying:2", "Arm:backoff"}},
				{ev: fire(split.TimerBackoff), want: []string{"SendPrefill:2"}},
				{ev: answered(handoff), want: cat(endOK, []string{"SendDecode"})},
			}},
		{name: "retries spent: fallback on the last failure", start: noHedge, startOps: startOps, retries: 1,
			steps: []step{
				{ev: failed(errServer), want: []string{"Retrying:1", "Arm:backoff"}},
				{ev: fire(split.TimerBackoff), want: []string{"SendPrefill:1"}},
				{ev: failed(errUnreachable), want: cat(endOK, []string{"Degraded:unreachable", "SendLocal"})},
			}},
		{name: "failed with its history: sent again at once without it, no retry spent", start: noHedge, startOps: startOps,
			steps: []step{
				{ev: failed(errHistory), want: []string{"SendPrefill:0:plain"}},
				{ev: answered(handoff), want: cat(endOK, []string{"SendDecode"})},
			}},
		{name: "failed with its history, then again: retried, then fallback", start: noHedge, startOps: startOps, retries: 1,
			steps: []step{
				{ev: failed(errHistory), want: []string{"SendPrefill:0:plain"}},
				{ev: failed(errServer), want: []string{"Retrying:1", "Arm:backoff"}},
				{ev: fire(split.TimerBackoff), want: []string{"SendPrefill:1"}},
				{ev: failed(errHistory), want: cat(endOK, []string{"Degraded:server_error", "SendLocal"})},
			}},
		{name: "rejection is not retried", start: noHedge, startOps: startOps, retries: 3,
			steps: []step{{ev: failed(errRejected), want: cat(endOK, []string{"PassOn"})}}, done: true},
		{name: "timeout during an attempt: cancelled, fallback", start: noHedge, startOps: startOps,
			steps: []step{
				{ev: fire(split.TimerPrefill), want: []string{"CancelPrefill", "PrefillEnded", "BreakerDone", "Degraded:timeout", "SendLocal"}},
				{ev: failed(errUnreachable), want: nil}, // the abandoned attempt's end
				{ev: answered(handoff), want: nil},
			}},
		{name: "timeout during the backoff says the last failure", start: noHedge, startOps: startOps, retries: 3,
			steps: []step{
				{ev: failed(errServer), want: []string{"Retrying:1", "Arm:backoff"}},
				{ev: fire(split.TimerPrefill), want: []string{"CancelPrefill", "Disarm:backoff", "PrefillEnded", "BreakerDone", "Degraded:timeout", "SendLocal"}},
				{ev: fire(split.TimerBackoff), want: nil}, // disarmed: a late fire is ignored
			}},
		{name: "timeout with no fallback: answered", start: noHedge, startOps: startOps, fallback: false,
			steps: []step{{ev: fire(split.TimerPrefill), want: []string{"CancelPrefill", "PrefillEnded", "BreakerDone", "Fail:timed out"}}}, done: true},
		{name: "decode: KV load failure re-runs locally", start: noHedge, startOps: startOps,
			steps: []step{
				{ev: answered(handoff), want: cat(endOK, []string{"SendDecode"})},
				{ev: split.Event{Kind: split.LegFailed, Err: split.Recoverable(errKVLoad)}, want: []string{"Degraded:kv_load_failed", "SendLocal"}},
				{ev: split.Event{Kind: split.LegFailed, Err: errDecode}, want: []string{"Fail:decode engine"}},
			}, done: true},
		{name: "decode: KV load failure, no fallback: answered", start: noHedge, startOps: startOps, fallback: false,
			steps: []step{
				{ev: answered(handoff), want: cat(endOK, []string{"SendDecode"})},
				{ev: split.Event{Kind: split.LegFailed, Err: split.Recoverable(errKVLoad)}, want: []string{"Fail:kv load"}},
			}, done: true},
		{name: "decode: other failure answered", start: noHedge, startOps: startOps,
			steps: []step{
				{ev: answered(handoff), want: cat(endOK, []string{"SendDecode"})},
				{ev: split.Event{Kind: split.LegFailed, Err: errDecode}, want: []string{"Fail:decode engine"}},
			}, done: true},
		{name: "fallback's local leg fails: answered", start: noHedge, startOps: startOps,
			steps: []step{
				{ev: failed(errUnreachable), want: cat(endOK, []string{"Degraded:unreachable", "SendLocal"})},
				{ev: split.Event{Kind: split.LegFailed, Err: split.Recoverable(errKVLoad)}, want: []string{"Fail:kv load"}},
			}, done: true},
		{name: "client gone during the prefill", start: noHedge, startOps: startOps,
			steps: []step{
				{ev: split.Event{Kind: split.ClientGone, Err: errClientGone}, want: []string{"CancelPrefill", "Disarm:prefill", "PrefillEnded", "BreakerDone", "Fail:client gone"}},
				{ev: failed(errClientGone), want: nil},
				{ev: fire(split.TimerPrefill), want: nil},
			}, done: true},
		{name: "client gone during the backoff", start: noHedge, startOps: startOps, retries: 1,
			steps: []step{
				{ev: failed(errServer), want: []string{"Retrying:1", "Arm:backoff"}},
				{ev: split.Event{Kind: split.ClientGone, Err: errClientGone}, want: []string{"CancelPrefill", "Disarm:prefill", "Disarm:backoff", "PrefillEnded", "BreakerDone", "Fail:client gone"}},
			}, done: true},
		{name: "client gone during the decode: the leg reports it", start: noHedge, startOps: startOps,
			steps: []step{
				{ev: answered(handoff), want: cat(endOK, []string{"SendDecode"})},
				{ev: split.Event{Kind: split.ClientGone, Err: errClientGone}, want: nil},
				{ev: split.Event{Kind: split.LegFailed, Err: errClientGone}, want: []string{"Fail:client gone"}},
			}, done: true},

		// Hedging.
		{name: "hedge: prefill answers before the hedge point", start: hedgeOn, startOps: hedgeOps,
			steps: []step{
				{ev: answered(handoff), want: cat(endHedged, []string{"SendDecode"})},
				{ev: fire(split.TimerHedge), want: nil},
			}},
		{name: "hedge: budget spent, the prefill runs alone", start: hedgeDry, startOps: hedgeOps,
			steps: []step{
				{ev: fire(split.TimerHedge), want: nil},
				{ev: split.Event{Kind: split.HedgeReady}, want: nil},
				{ev: answered(handoff), want: cat(endOK, []string{"SendDecode"})},
			}},
		{name: "hedge: prefill answers first, local leg dropped", start: hedgeOn, startOps: hedgeOps,
			steps: []step{
				{ev: fire(split.TimerHedge), advance: 300 * time.Millisecond, want: []string{"SendHedge"}},
				{ev: answered(handoff), advance: 50 * time.Millisecond, want: cat(endOK, []string{"DropHedge", "HedgeWon:remote:50ms", "SendDecode"})},
				{ev: split.Event{Kind: split.HedgeReady}, want: nil},
			}},
		{name: "hedge: local leg ready first, prefill cancelled", start: hedgeOn, startOps: hedgeOps,
			steps: []step{
				{ev: fire(split.TimerHedge), advance: 300 * time.Millisecond, want: []string{"SendHedge"}},
				{ev: split.Event{Kind: split.HedgeReady}, advance: 100 * time.Millisecond, want: []string{"CancelPrefill", "Disarm:prefill", "PrefillEnded", "BreakerDone", "Degraded:slow_prefill", "HedgeWon:local:400ms", "RelayHedge"}},
				{ev: answered(handoff), want: nil},
				{ev: fire(split.TimerPrefill), want: nil},
			}},
		{name: "hedge: ready during the backoff", start: hedgeOn, startOps: hedgeOps, retries: 2,
			steps: []step{
				{ev: failed(errServer), want: []string{"Retrying:1", "Arm:backoff"}},
				{ev: fire(split.TimerHedge), want: []string{"SendHedge"}},
				{ev: split.Event{Kind: split.HedgeReady}, want: []string{"CancelPrefill", "Disarm:prefill", "Disarm:backoff", "PrefillEnded", "BreakerDone", "Degraded:slow_prefill", "HedgeWon:local", "RelayHedge"}},
				{ev: fire(split.TimerBackoff), want: nil},
			}},
		{name: "hedge: prefill fails, the local leg is its fallback", start: hedgeOn, startOps: hedgeOps,
			steps: []step{
				{ev: fire(split.TimerHedge), want: []string{"SendHedge"}},
				{ev: failed(errUnreachable), want: cat(endOK, []string{"Degraded:unreachable"})},
				{ev: split.Event{Kind: split.HedgeReady}, want: []string{"HedgeWon:local", "RelayHedge"}},
			}},
		{name: "hedge: prefill fails, then the local leg fails", start: hedgeOn, startOps: hedgeOps,
			steps: []step{
				{ev: fire(split.TimerHedge), want: []string{"SendHedge"}},
				{ev: failed(errUnreachable), want: cat(endOK, []string{"Degraded:unreachable"})},
				{ev: split.Event{Kind: split.HedgeFailed, Err: errLocal}, want: []string{"DropHedge", "Fail:local leg"}},
			}, done: true},
		{name: "hedge: prefill rejected, local leg dropped, rejection passed on", start: hedgeOn, startOps: hedgeOps,
			steps: []step{
				{ev: fire(split.TimerHedge), want: []string{"SendHedge"}},
				{ev: failed(errRejected), want: cat(endOK, []string{"DropHedge", "PassOn"})},
			}, done: true},
		{name: "hedge: prefill fails with no fallback, local leg dropped", start: hedgeOn, startOps: hedgeOps, fallback: false,
			steps: []step{
				{ev: fire(split.TimerHedge), want: []string{"SendHedge"}},
				{ev: failed(errUnreachable), want: cat(endOK, []string{"DropHedge", "Fail:unreachable"})},
			}, done: true},
		{name: "hedge: local leg fails, the prefill goes on", start: hedgeOn, startOps: hedgeOps,
			steps: []step{
				{ev: fire(split.TimerHedge), want: []string{"SendHedge"}},
				{ev: split.Event{Kind: split.HedgeFailed, Err: errLocal}, want: []string{"DropHedge", "HedgeLocalFailed"}},
				{ev: answered(handoff), want: cat(endOK, []string{"SendDecode"})},
			}},
		{name: "hedge: timeout while hedged, the local leg is the fallback", start: hedgeOn, startOps: hedgeOps,
			steps: []step{
				{ev: fire(split.TimerHedge), want: []string{"SendHedge"}},
				{ev: fire(split.TimerPrefill), want: []string{"CancelPrefill", "PrefillEnded", "BreakerDone", "Degraded:timeout"}},
				{ev: split.Event{Kind: split.HedgeReady}, want: []string{"HedgeWon:local", "RelayHedge"}},
			}},
		{name: "hedge: client gone while hedged", start: hedgeOn, startOps: hedgeOps,
			steps: []step{
				{ev: fire(split.TimerHedge), want: []string{"SendHedge"}},
				{ev: split.Event{Kind: split.ClientGone, Err: errClientGone}, want: []string{"CancelPrefill", "Disarm:prefill", "PrefillEnded", "BreakerDone", "DropHedge", "Fail:client gone"}},
				{ev: split.Event{Kind: split.HedgeReady}, want: nil},
			}, done: true},
		{name: "hedge: client gone while awaiting the hedge", start: hedgeOn, startOps: hedgeOps,
			steps: []step{
				{ev: fire(split.TimerHedge), want: []string{"SendHedge"}},
				{ev: failed(errUnreachable), want: cat(endOK, []string{"Degraded:unreachable"})},
				{ev: split.Event{Kind: split.ClientGone, Err: errClientGone}, want: []string{"DropHedge", "Fail:client gone"}},
			}, done: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fb := tc.fallback || !strings.Contains(tc.name, "no fallback")
			clk := &clock{t: time.Unix(1000, 0)}
			m := split.NewSequential(split.Config{
				PrefillTimeout: 2 * time.Second, MaxRetries: tc.retries, RetryBackoff: 10 * time.Millisecond,
				Fallback: fb, DecodeTPSize: 4, Judge: judge, Now: clk.now,
			})
			assert.Equal(t, tc.startOps, describe(m.Start(tc.start), tc.startOps), "start")
			for i, s := range tc.steps {
				clk.t = clk.t.Add(s.advance)
				got := m.On(s.ev)
				assert.Equal(t, s.want, describe(got, s.want), "step %d", i)
			}
			assert.Equal(t, tc.done, m.Done(), "done")
		})
	}
}

// describe names each action as the wanted ones do: with the detail the
// corresponding wanted entry asks for.
func describe(acts []split.Action, want []string) []string {
	var out []string
	for i, a := range acts {
		name := opName(a.Op)
		detail := ""
		if i < len(want) {
			if _, d, ok := strings.Cut(want[i], ":"); ok {
				detail = d
			}
		}
		if detail != "" {
			name += ":" + actionDetail(a, detail)
		}
		out = append(out, name)
	}
	return out
}

// actionDetail renders what a wanted detail checks: the timer, the
// attempt, the reason, the winner (and the loser's time), or the error's
// text when it holds the detail.
func actionDetail(a split.Action, detail string) string {
	switch a.Op {
	case split.Arm, split.Disarm:
		return timerName(a.Timer)
	case split.SendPrefill, split.Retrying:
		if a.Plain {
			return fmt.Sprint(a.Attempt) + ":plain"
		}
		return fmt.Sprint(a.Attempt)
	case split.Degraded:
		return a.Reason
	case split.PrefillLegFailed:
		if a.Attempt == 1 {
			return a.Reason + ":late"
		}
		return a.Reason
	case split.HedgeWon:
		if strings.Count(detail, ":") == 1 {
			return a.Winner + ":" + a.After.String()
		}
		return a.Winner
	}
	if a.Err != nil && strings.Contains(a.Err.Error(), detail) {
		return detail
	}
	return fmt.Sprintf("%v", a.Err)
}

func opName(op split.Op) string {
	names := map[split.Op]string{
		split.SendPrefill: "SendPrefill", split.CancelPrefill: "CancelPrefill", split.Arm: "Arm", split.Disarm: "Disarm",
		split.SendHedge: "SendHedge", split.DropHedge: "DropHedge", split.RelayHedge: "RelayHedge",
		split.SendDecode: "SendDecode", split.SendLocal: "SendLocal", split.AnswerPrefill: "AnswerPrefill",
		split.PassOn: "PassOn", split.Fail: "Fail", split.PrefillBegan: "PrefillBegan", split.PrefillEnded: "PrefillEnded",
		split.BreakerDone: "BreakerDone", split.Retrying: "Retrying", split.Degraded: "Degraded", split.HedgeWon: "HedgeWon",
		split.HedgeLocalFailed: "HedgeLocalFailed",
		split.CancelDecode:     "CancelDecode", split.AbandonPrefill: "AbandonPrefill", split.ReleaseOutput: "ReleaseOutput",
		split.PrefillLegFailed: "PrefillLegFailed", split.OutputAtKVWait: "OutputAtKVWait", split.HandoffFailed: "HandoffFailed",
	}
	if n, ok := names[op]; ok {
		return n
	}
	return fmt.Sprintf("Op(%d)", op)
}

func timerName(t split.Timer) string {
	switch t {
	case split.TimerPrefill:
		return "prefill"
	case split.TimerBackoff:
		return "backoff"
	case split.TimerHedge:
		return "hedge"
	case split.TimerKVWait:
		return "kvwait"
	}
	return "?"
}

// The timeout's error says the timeout and the last attempt's failure.
func TestSequentialTimeoutError(t *testing.T) {
	m := split.NewSequential(split.Config{PrefillTimeout: 2 * time.Second, MaxRetries: 1, Fallback: false, Judge: judge})
	m.Start(split.Start{})
	m.On(failed(fmt.Errorf("wrapped: %w", errServer)))
	acts := m.On(fire(split.TimerPrefill))
	require.NotEmpty(t, acts)
	last := acts[len(acts)-1]
	require.Equal(t, split.Fail, last.Op)
	assert.ErrorIs(t, last.Err, split.ErrPrefillTimeout)
	assert.ErrorIs(t, last.Err, errServer)
	assert.Equal(t, "prefill timed out after 2s (after wrapped: prefiller 5xx)", last.Err.Error())
}

// The cause of every prefill end reaches the breaker and the span; a
// hedge's win reports ErrHedgeLost, which the breaker takes as no verdict.
func TestSequentialEndCause(t *testing.T) {
	m := split.NewSequential(split.Config{PrefillTimeout: time.Second, Fallback: true, Judge: judge})
	m.Start(hedgeOn)
	m.On(fire(split.TimerHedge))
	for _, a := range m.On(split.Event{Kind: split.HedgeReady}) {
		if a.Op == split.BreakerDone || a.Op == split.PrefillEnded || a.Op == split.CancelPrefill {
			assert.ErrorIs(t, a.Err, split.ErrHedgeLost, "%s", opName(a.Op))
		}
	}
}

// A request whose named prefiller is refused follows the rule every
// split's fallback follows.
func TestRefused(t *testing.T) {
	cases := []struct {
		name     string
		fallback bool
		cause    error
		want     []string
	}{
		{"a reason, fallback on", true, errCircuitOpen, []string{"Degraded:circuit_open", "SendLocal"}},
		{"a reason, fallback off", false, errCircuitOpen, []string{"Fail:circuit open"}},
		{"no reason", true, errBadRequest, []string{"Fail:bad request"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := split.Refused(split.Config{Fallback: tc.fallback, Judge: judge}, tc.cause)
			assert.Equal(t, tc.want, describe(got, tc.want))
		})
	}
}
