package split_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

var (
	errFirstLeg     = errors.New("decode engine failed before output")
	errAfterDecline = errors.New("after-decline body not built")

	firstReady    = split.Event{Kind: split.FirstAnswerReady}
	firstDeclined = split.Event{Kind: split.FirstAnswerDeclined}
	firstFailed   = split.Event{Kind: split.FirstLegFailed, Err: errFirstLeg}
	firstGone     = split.Event{Kind: split.ClientGone, Err: errClientGone}
	rebuilt       = split.Event{Kind: split.AfterDeclineBuilt}
	rebuildFailed = split.Event{Kind: split.AfterDeclineFailed, Err: errAfterDecline}
)

func TestDecodeFirstEventOrders(t *testing.T) {
	var (
		sendOps     = []string{"SendDecodeFirst"}
		servedOps   = []string{"RelayDecodeFirst", "DecodeFirstCounted:served"}
		declinedOps = []string{"DropDecodeFirst", "DecodeFirstCounted:declined", "BuildAfterDecline"}
		splitOps    = []string{"RunSplit:declined"}
	)
	cases := []struct {
		name     string
		try      bool
		before   []split.Event // fed before Start: ignored
		startOps []string
		steps    []step
		split    bool // handed to the usual split
	}{
		{name: "not tried: the usual split", try: false, startOps: []string{"RunSplit:"}, steps: []step{
			{ev: firstReady, want: nil},
			{ev: firstDeclined, want: nil},
			{ev: firstGone, want: nil},
		}, split: true},
		{name: "events before the start are ignored", try: true, before: []split.Event{firstReady, firstDeclined, firstFailed, firstGone, rebuilt},
			startOps: sendOps, steps: []step{
				{ev: firstReady, want: servedOps},
			}},
		{name: "served: relayed, counted", try: true, startOps: sendOps, steps: []step{
			{ev: firstReady, want: servedOps},
			{ev: firstGone, want: nil}, // the relay sees the client leave itself
			{ev: firstDeclined, want: nil},
			{ev: firstFailed, want: nil},
			{ev: rebuilt, want: nil},
		}},
		{name: "declined: dropped, counted, the usual split on the body after decline", try: true, startOps: sendOps, steps: []step{
			{ev: firstDeclined, want: declinedOps},
			{ev: firstReady, want: nil},
			{ev: firstFailed, want: nil},
			{ev: rebuilt, want: splitOps},
			{ev: rebuildFailed, want: nil},
			{ev: firstGone, want: nil},
		}, split: true},
		{name: "declined, the body after decline not built: answered", try: true, startOps: sendOps, steps: []step{
			{ev: firstDeclined, want: declinedOps},
			{ev: rebuildFailed, want: []string{"Fail:after-decline body"}},
			{ev: rebuilt, want: nil},
		}},
		{name: "declined, then the client leaves: the usual split sees it", try: true, startOps: sendOps, steps: []step{
			{ev: firstDeclined, want: declinedOps},
			{ev: firstGone, want: nil},
			{ev: rebuilt, want: splitOps},
		}, split: true},
		{name: "failed before output: answered", try: true, startOps: sendOps, steps: []step{
			{ev: firstFailed, want: []string{"Fail:before output"}},
			{ev: firstReady, want: nil},
			{ev: firstDeclined, want: nil},
			{ev: firstGone, want: nil},
		}},
		{name: "client gone before the answer is relayed: dropped, answered as gone", try: true, startOps: sendOps, steps: []step{
			{ev: firstGone, want: []string{"DropDecodeFirst", "Fail:client gone"}},
			{ev: firstReady, want: nil},
			{ev: firstDeclined, want: nil},
			{ev: firstFailed, want: nil},
			{ev: firstGone, want: nil},
		}},
		{name: "client gone, then the leg fails: one answer", try: true, startOps: sendOps, steps: []step{
			{ev: firstGone, want: []string{"DropDecodeFirst", "Fail:client gone"}},
			{ev: firstFailed, want: nil},
		}},
		{name: "a body built before any answer is ignored", try: true, startOps: sendOps, steps: []step{
			{ev: rebuilt, want: nil},
			{ev: rebuildFailed, want: nil},
			{ev: firstDeclined, want: declinedOps},
			{ev: rebuilt, want: splitOps},
		}, split: true},
		{name: "other splits' events are ignored", try: true, startOps: sendOps, steps: []step{
			{ev: split.Event{Kind: split.PrefillAnswered}, want: nil},
			{ev: failed(errServer), want: nil},
			{ev: fire(split.TimerPrefill), want: nil},
			{ev: split.Event{Kind: split.LegFailed, Err: errDecode}, want: nil},
			{ev: firstFailed, want: []string{"Fail:before output"}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := split.NewDecodeFirst()
			for _, ev := range tc.before {
				assert.Empty(t, m.On(ev), "before the start")
			}
			assert.False(t, m.Done(), "idle")
			assert.Equal(t, tc.startOps, describeFirst(m.Start(tc.try)), "start")
			assert.Empty(t, m.Start(tc.try), "a second start")
			ran := tc.startOps[0] == "RunSplit:"
			for i, s := range tc.steps {
				got := asWanted(describeFirst(m.On(s.ev)), s.want)
				assert.Equal(t, s.want, got, "step %d", i)
				ran = ran || (len(got) > 0 && strings.HasPrefix(got[0], "RunSplit"))
			}
			assert.True(t, m.Done(), "done")
			assert.Equal(t, tc.split, ran, "handed to the usual split")
		})
	}
}

// Every order of the attempt's events (720) decides the request at most
// once: the first of the leg's events (ready, declined, failed, client
// gone) decides, and after a decline the first word on the body after it;
// all else is ignored.
func TestDecodeFirstEveryOrder(t *testing.T) {
	evs := []split.Event{firstReady, firstDeclined, firstFailed, firstGone, rebuilt, rebuildFailed}
	for _, order := range permutations(len(evs)) {
		var names []string
		for _, i := range order {
			names = append(names, eventName(evs[i]))
		}
		t.Run(strings.Join(names, ","), func(t *testing.T) {
			m := split.NewDecodeFirst()
			got := describeFirst(m.Start(true))
			for _, i := range order {
				got = append(got, describeFirst(m.On(evs[i]))...)
			}
			want := oracle(evs, order)
			assert.Equal(t, want, got)
			// Undecided only when both words on the body came before the decline.
			assert.Equal(t, want[len(want)-1] != "BuildAfterDecline", m.Done(), "done")
		})
	}
}

// oracle is what a decode-first attempt fed evs in order must do, worked
// out from the order alone.
func oracle(evs []split.Event, order []int) []string {
	want := []string{"SendDecodeFirst"}
	declined := false
	for _, i := range order {
		switch k := evs[i].Kind; {
		case !declined && k == split.FirstAnswerReady:
			return append(want, "RelayDecodeFirst", "DecodeFirstCounted:served")
		case !declined && k == split.FirstLegFailed:
			return append(want, "Fail:"+evs[i].Err.Error())
		case !declined && k == split.ClientGone:
			return append(want, "DropDecodeFirst", "Fail:"+evs[i].Err.Error())
		case !declined && k == split.FirstAnswerDeclined:
			declined = true
			want = append(want, "DropDecodeFirst", "DecodeFirstCounted:declined", "BuildAfterDecline")
		case declined && k == split.AfterDeclineBuilt:
			return append(want, "RunSplit:declined")
		case declined && k == split.AfterDeclineFailed:
			return append(want, "Fail:"+evs[i].Err.Error())
		}
	}
	return want
}

// The failure answered is the event's own error, unwrapped.
func TestDecodeFirstFailCause(t *testing.T) {
	cause := fmt.Errorf("wrapped: %w", errFirstLeg)
	m := split.NewDecodeFirst()
	m.Start(true)
	acts := m.On(split.Event{Kind: split.FirstLegFailed, Err: cause})
	require.Len(t, acts, 1)
	assert.Equal(t, split.Fail, acts[0].Op)
	assert.Same(t, cause, acts[0].Err)
}

// describeFirst names each action of a decode-first attempt, with its
// detail: the outcome or split's reason, the failure's text.
func describeFirst(acts []split.Action) []string {
	var out []string
	for _, a := range acts {
		switch a.Op {
		case split.SendDecodeFirst:
			out = append(out, "SendDecodeFirst")
		case split.DropDecodeFirst:
			out = append(out, "DropDecodeFirst")
		case split.RelayDecodeFirst:
			out = append(out, "RelayDecodeFirst")
		case split.BuildAfterDecline:
			out = append(out, "BuildAfterDecline")
		case split.RunSplit:
			out = append(out, "RunSplit:"+a.Reason)
		case split.DecodeFirstCounted:
			out = append(out, "DecodeFirstCounted:"+a.Reason)
		case split.Fail:
			out = append(out, "Fail:"+a.Err.Error())
		default:
			out = append(out, opName(a.Op))
		}
	}
	return out
}

// asWanted renders got as want does: a wanted failure names part of the
// error's text ("Fail:client gone").
func asWanted(got, want []string) []string {
	for i, g := range got {
		if i < len(want) && strings.HasPrefix(g, "Fail:") && strings.HasPrefix(want[i], "Fail:") &&
			strings.Contains(g, strings.TrimPrefix(want[i], "Fail:")) {
			got[i] = want[i]
		}
	}
	return got
}

func eventName(ev split.Event) string {
	switch ev.Kind {
	case split.FirstAnswerReady:
		return "ready"
	case split.FirstAnswerDeclined:
		return "declined"
	case split.FirstLegFailed:
		return "failed"
	case split.ClientGone:
		return "gone"
	case split.AfterDeclineBuilt:
		return "built"
	case split.AfterDeclineFailed:
		return "build-failed"
	}
	return fmt.Sprint(ev.Kind)
}

// permutations returns every order of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{nil}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int(nil), p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}
