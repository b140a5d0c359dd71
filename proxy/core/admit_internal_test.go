package core

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// appender is an admitter that appends its mark to the body, in line or
// (wait) in a step's continuation, or refuses the request there (refuse)
// or in line (fail); it records the body it saw.
type appender struct {
	mark       string
	wait       bool
	refuse     error
	fail       error
	saw        *[]string
	routeLocal string // set as the decode engine
}

func (ap appender) Admit(a *feature.Admission, _ feature.Head) (feature.Step, error) {
	*ap.saw = append(*ap.saw, string(a.Body))
	if ap.fail != nil {
		return nil, ap.fail
	}
	if ap.routeLocal != "" {
		a.Local, a.Routed = ap.routeLocal, true
	}
	if !ap.wait {
		a.Body = append(append([]byte(nil), a.Body...), ap.mark...)
		return nil, nil
	}
	return func(context.Context) func() {
		return func() {
			if ap.refuse != nil {
				a.Refusal = ap.refuse
				return
			}
			a.Body = append(append([]byte(nil), a.Body...), ap.mark...)
		}
	}, nil
}

// TestAdmitRunsAdmitters: the admitters run in order on the request's
// state, each seeing what the one before changed; a step's continuation
// works on the request as it stands when it runs (its body moved by the
// driver meanwhile) and its refusal, as an admitter's error, refuses the
// request before any later admitter runs.
func TestAdmitRunsAdmitters(t *testing.T) {
	errNo := errors.New("no")
	for _, tc := range []struct {
		name  string
		as    []appender
		waits int // the steps the admission waits on
		saw   []string
		body  string // the request's body after admission
		err   error  // the refusal
		local string // the decode engine after admission
	}{
		{name: "in line", as: []appender{{mark: "a"}, {mark: "b"}}, saw: []string{"{}", "{}a"}, body: "{}ab", local: "home:1"},
		{name: "a step between", as: []appender{{mark: "a"}, {mark: "b", wait: true}, {mark: "c"}}, waits: 1,
			saw: []string{"{}", "{}a", "{}ab"}, body: "{}abc", local: "home:1"},
		{name: "refused by a step", as: []appender{{mark: "a", wait: true, refuse: errNo}, {mark: "b"}}, waits: 1,
			saw: []string{"{}"}, err: errNo, body: "{}", local: "home:1"},
		{name: "refused in line", as: []appender{{mark: "a", routeLocal: "rank:2"}, {fail: errNo}, {mark: "c"}},
			saw: []string{"{}", "{}a"}, err: errNo, body: "{}a", local: "rank:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewSidecar(DefaultConfig(), nixlv2.New(), metrics.New(prometheus.NewRegistry(), 0), zerolog.Nop())
			require.NoError(t, err)
			var saw []string
			p.admitters = nil
			for _, ap := range tc.as {
				ap.saw = &saw
				p.admitters = append(p.admitters, ap)
			}
			var h fasthttp.RequestHeader
			client := []byte("{}")
			r := p.StartRequest(Arrival{ID: []byte("rid"), Head: &h, Body: client, Local: "home:1", API: connectors.APIChat})
			defer r.Cancel(context.Canceled)
			waits := 0
			a := r.Admit(&h)
			for a.Wait != nil {
				waits++
				// The driver moves the body off its read buffer, which it
				// then reuses, before the step runs.
				r.Body = append([]byte(nil), r.Body...)
				copy(client, "xx")
				a.Wait(r.Ctx)()
				a = r.Admit(&h)
			}
			assert.Equal(t, tc.waits, waits)
			assert.Equal(t, tc.saw, saw)
			if tc.err != nil {
				assert.Equal(t, RouteFail, a.Route)
				require.ErrorIs(t, a.Err, tc.err)
			} else {
				assert.Equal(t, RouteLocal, a.Route)
				require.NoError(t, a.Err)
			}
			assert.Equal(t, tc.body, string(r.Body))
			assert.Equal(t, tc.local, r.Local)
			assert.Equal(t, tc.local != "home:1", r.dpRouted)
			assert.Equal(t, feature.Admission{}, r.adm.a, "the admission keeps nothing between parts")
		})
	}
}
