package split_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

func judgePaired(err error) split.Verdict {
	if errors.Is(err, split.ErrKVWaitTimeout) {
		return split.Verdict{Reason: "kv_wait_timeout"}
	}
	return judge(err)
}

func TestPairedEventOrders(t *testing.T) {
	var (
		legs       = []string{"SendPrefill", "SendDecode"}
		withKV     = []string{"SendPrefill", "SendDecode", "Arm:kvwait"}
		withTimer  = []string{"SendPrefill", "SendDecode", "Arm:prefill"}
		timed      = split.PairedConfig{PrefillTimeout: time.Second}
		timedOut   = fmt.Errorf("%w after 1s (context canceled)", split.ErrPrefillTimeout)
		ok         = split.Event{Kind: split.PrefillAnswered}
		output     = split.Event{Kind: split.FirstOutput}
		decodeOK   = split.Event{Kind: split.DecodeEnded}
		gone       = split.Event{Kind: split.ClientGone, Err: errClientGone}
		decodeFail = func(err error, rec bool) split.Event {
			if rec {
				err = split.Recoverable(err)
			}
			return split.Event{Kind: split.DecodeEnded, Err: err}
		}
	)
	cases := []struct {
		name     string
		cfg      split.PairedConfig
		start    split.PairedStart
		startOps []string
		steps    []step
		done     bool
	}{
		{name: "both answer", startOps: legs, steps: []step{
			{ev: output, want: nil},
			{ev: decodeOK, want: nil},
			{ev: ok, want: []string{"BreakerDone"}},
		}, done: true},
		{name: "prefill answers before the output", startOps: legs, steps: []step{
			{ev: ok, want: []string{"BreakerDone"}},
			{ev: output, want: nil},
			{ev: decodeOK, want: nil},
		}, done: true},
		{name: "circuit open: fallback", start: split.PairedStart{NoLegs: errCircuitOpen}, startOps: []string{"Degraded:circuit_open", "SendLocal"}, done: true},
		{name: "bootstrap failed: reported, fallback", start: split.PairedStart{NoLegs: errUnreachable, NoLegsReport: errUnreachable},
			startOps: []string{"BreakerDone:prefiller unreachable", "Degraded:unreachable", "SendLocal"}, done: true},
		{name: "legs not built: reported as the request's fault, answered", start: split.PairedStart{NoLegs: errBadRequest, NoLegsReport: errBadRequest},
			startOps: []string{"BreakerDone:bad request", "Fail:bad request"}, done: true},
		{name: "prefill fails first: decode cancelled, fallback", startOps: legs, steps: []step{
			{ev: failed(errServer), want: []string{"BreakerDone:prefiller 5xx", "PrefillLegFailed:server_error", "CancelDecode:prefiller 5xx"}},
			{ev: output, want: nil}, // a late output of the cancelled decode
			{ev: decodeFail(errDecode, false), want: []string{"Degraded:server_error", "SendLocal"}},
		}, done: true},
		{name: "prefill rejects: decode cancelled, rejection passed on", startOps: legs, steps: []step{
			{ev: failed(errRejected), want: []string{"BreakerDone:prefiller 4xx", "PrefillLegFailed:rejected", "CancelDecode:prefiller 4xx"}},
			{ev: decodeFail(errDecode, false), want: []string{"PassOn"}},
		}, done: true},
		{name: "prefill timeout: leg cancelled, its end decides: fallback", cfg: timed, startOps: withTimer, steps: []step{
			{ev: fire(split.TimerPrefill), want: []string{"CancelPrefill:prefill timed out after 1s"}},
			{ev: fire(split.TimerPrefill), want: nil}, // fired once
			{ev: failed(timedOut), want: []string{"BreakerDone:prefill timed out", "PrefillLegFailed:timeout", "CancelDecode:prefill timed out"}},
			{ev: decodeFail(errDecode, false), want: []string{"Degraded:timeout", "SendLocal"}},
		}, done: true},
		{name: "prefill timeout after the output: counted, the answer goes on", cfg: timed, startOps: withTimer, steps: []step{
			{ev: output, want: nil},
			{ev: fire(split.TimerPrefill), want: []string{"CancelPrefill:prefill timed out"}},
			{ev: failed(timedOut), want: []string{"BreakerDone:prefill timed out", "PrefillLegFailed:timeout:late"}},
			{ev: decodeOK, want: nil},
		}, done: true},
		{name: "prefill answers in time: its timer disarmed", cfg: timed, startOps: withTimer, steps: []step{
			{ev: ok, want: []string{"Disarm:prefill", "BreakerDone"}},
			{ev: fire(split.TimerPrefill), want: nil}, // a fire already on its way
			{ev: output, want: nil},
			{ev: decodeOK, want: nil},
		}, done: true},
		{name: "client left: prefill abandoned, its timer then ignored", cfg: timed, startOps: withTimer, steps: []step{
			{ev: gone, want: []string{"AbandonPrefill:client gone"}},
			{ev: fire(split.TimerPrefill), want: nil},
			{ev: failed(errClientGone), want: []string{"BreakerDone:prefill leg abandoned"}},
			{ev: decodeFail(errClientGone, false), want: []string{"Fail:client gone"}},
		}, done: true},
		{name: "prefill fails after the output: counted, the answer goes on", startOps: legs, steps: []step{
			{ev: output, want: nil},
			{ev: failed(errServer), want: []string{"BreakerDone:prefiller 5xx", "PrefillLegFailed:server_error:late"}},
			{ev: decodeOK, want: nil},
		}, done: true},
		{name: "prefill fails after the decode ended", startOps: legs, steps: []step{
			{ev: output, want: nil},
			{ev: decodeOK, want: nil},
			{ev: failed(errServer), want: []string{"BreakerDone:prefiller 5xx", "PrefillLegFailed:server_error:late"}},
		}, done: true},
		{name: "decode fails: prefill abandoned, its end neutral", startOps: legs, steps: []step{
			{ev: decodeFail(errDecode, false), want: []string{"AbandonPrefill", "Fail:decode engine"}},
			{ev: failed(errUnreachable), want: []string{"BreakerDone:abandoned"}},
		}, done: true},
		{name: "decode KV load failure: fallback", startOps: legs, steps: []step{
			{ev: decodeFail(errKVLoad, true), want: []string{"AbandonPrefill", "HandoffFailed", "Degraded:kv_load_failed", "SendLocal"}},
		}, done: true},
		{name: "decode KV load failure, no fallback", cfg: split.PairedConfig{Fallback: false}, startOps: legs, steps: []step{
			{ev: decodeFail(errKVLoad, true), want: []string{"AbandonPrefill", "HandoffFailed", "Fail:kv load"}},
		}, done: true},
		{name: "client gone: prefill abandoned, answered as gone", startOps: legs, steps: []step{
			{ev: gone, want: []string{"AbandonPrefill"}},
			{ev: failed(errUnreachable), want: []string{"BreakerDone:abandoned"}},
			{ev: decodeFail(errClientGone, false), want: []string{"Fail:client gone"}},
		}, done: true},
		{name: "prefill failed first, then the client left: answered as gone", startOps: legs, steps: []step{
			{ev: failed(errServer), want: []string{"BreakerDone:prefiller 5xx", "PrefillLegFailed:server_error", "CancelDecode:prefiller 5xx"}},
			{ev: gone, want: nil},
			{ev: decodeFail(errClientGone, false), want: []string{"Fail:client gone"}},
		}, done: true},

		// MoRI-IO's parallel dispatch: the KV wait and the held output.
		{name: "kv wait: output held until the prefill answers", cfg: split.PairedConfig{KVWait: time.Second, HoldOutput: true}, startOps: withKV, steps: []step{
			{ev: output, want: nil},
			{ev: ok, want: []string{"ReleaseOutput", "Disarm:kvwait", "BreakerDone"}},
			{ev: decodeOK, want: nil},
		}, done: true},
		{name: "kv wait: prefill answered first, output not held", cfg: split.PairedConfig{KVWait: time.Second, HoldOutput: true}, startOps: withKV, steps: []step{
			{ev: ok, want: []string{"Disarm:kvwait", "BreakerDone"}},
			{ev: output, want: nil},
			{ev: decodeOK, want: nil},
		}, done: true},
		{name: "kv wait runs out with no outcome: both cancelled, fallback", cfg: split.PairedConfig{KVWait: time.Second, HoldOutput: true}, startOps: withKV, steps: []step{
			{ev: fire(split.TimerKVWait), want: []string{"CancelDecode:KV-wait timeout (1s)", "AbandonPrefill"}},
			{ev: failed(errUnreachable), want: []string{"BreakerDone:abandoned"}},
			{ev: decodeFail(errDecode, false), want: []string{"Degraded:kv_wait_timeout", "SendLocal"}},
		}, done: true},
		{name: "kv wait runs out while the output is held: relayed", cfg: split.PairedConfig{KVWait: time.Second, HoldOutput: true}, startOps: withKV, steps: []step{
			{ev: output, want: nil},
			{ev: fire(split.TimerKVWait), want: []string{"OutputAtKVWait", "ReleaseOutput"}},
			{ev: ok, want: []string{"BreakerDone"}},
			{ev: decodeOK, want: nil},
		}, done: true},
		{name: "kv wait: prefill fails while the output is held", cfg: split.PairedConfig{KVWait: time.Second, HoldOutput: true}, startOps: withKV, steps: []step{
			{ev: output, want: nil},
			{ev: failed(errServer), want: []string{"ReleaseOutput", "Disarm:kvwait", "BreakerDone:prefiller 5xx", "PrefillLegFailed:server_error:late"}},
			{ev: decodeOK, want: nil},
		}, done: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Fallback = !(tc.name == "decode KV load failure, no fallback")
			cfg.Judge = judgePaired
			m := split.NewPaired(cfg)
			assert.Equal(t, tc.startOps, describe(m.Start(tc.start), tc.startOps), "start")
			for i, s := range tc.steps {
				assert.Equal(t, s.want, describe(m.On(s.ev), s.want), "step %d", i)
			}
			assert.Equal(t, tc.done, m.Done(), "done")
		})
	}
}

// The KV wait's error is ErrKVWaitTimeout with the bound.
func TestPairedKVWaitError(t *testing.T) {
	m := split.NewPaired(split.PairedConfig{KVWait: 2 * time.Second, Fallback: false, Judge: judgePaired})
	m.Start(split.PairedStart{})
	acts := m.On(fire(split.TimerKVWait))
	require.NotEmpty(t, acts)
	assert.ErrorIs(t, acts[0].Err, split.ErrKVWaitTimeout)
	assert.Contains(t, acts[0].Err.Error(), "(2s)")
}
