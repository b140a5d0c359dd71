package moriwrite

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/hostdns"
)

type nopLog struct{}

func (nopLog) LogAt(zerolog.Level) *zerolog.Event { return nil }

// split begins the feature's part in a split request.
func split(t *testing.T, s *State, id string) *use {
	t.Helper()
	u, ok := Feature{State: s}.Begin(feature.Request{ID: id, Prefiller: "10.0.0.1:8000", Log: nopLog{}}, nil).(*use)
	require.True(t, ok)
	return u
}

func newState(t *testing.T, parallel bool, dp int, seed map[string]string, lookup hostdns.LookupFunc) *State {
	t.Helper()
	cfg := Config{WriteMode: true, ParallelDispatch: parallel, PodIP: "decode.svc",
		RemoteHosts: []string{"10.0.0.1", "prefill.svc"}, Ports: moriio.Ports{DPSize: dp, TPSize: 1},
		WaitTimeout: time.Second, DNSTTL: time.Minute, DNSTimeout: time.Second, Seed: seed, Lookup: lookup}
	require.NoError(t, cfg.Validate())
	return NewState(cfg, metrics.New(prometheus.NewRegistry(), 0).MoriIO, zerolog.Nop())
}

// TestNoPartOutsideASplit: a request that is not split, or whose
// prefiller is refused, has no MoRI-IO part.
func TestNoPartOutsideASplit(t *testing.T) {
	s := newState(t, false, 1, nil, nil)
	assert.Nil(t, Feature{State: s}.Begin(feature.Request{ID: "rid"}, nil))
	assert.Nil(t, Feature{State: s}.Begin(feature.Request{ID: "rid", Prefiller: "10.0.0.1:8000", Refused: true}, nil))
}

// TestResolveStep: a MoRI-IO split, serial or parallel dispatch,
// whose host specs do not all have an address yet waits on their
// resolution as a step of its admission, run off the event loop (or on
// fasthttp's goroutine); its legs then name what the step resolved, and
// build without waiting on DNS. A split whose specs all have an address
// has no step.
func TestResolveStep(t *testing.T) {
	var lookups atomic.Int32
	resolves := func(context.Context, string) ([]string, error) { lookups.Add(1); return []string{"10.9.0.1"}, nil }
	fails := func(context.Context, string) ([]string, error) {
		lookups.Add(1)
		return nil, errors.New("no such host")
	}
	for _, c := range []struct {
		name      string
		parallel  bool
		seed      map[string]string
		lookup    hostdns.LookupFunc
		waits     bool // before any lookup
		waitsNext bool // for the next split, once one resolved the specs
		wantPod   string
	}{
		{"serial, every spec seeded", false, map[string]string{"decode.svc": "10.0.0.2", "prefill.svc": "10.0.0.3"}, resolves, false, false, "10.0.0.2"},
		{"serial, a spec not resolved yet", false, map[string]string{"decode.svc": "10.0.0.2"}, resolves, true, false, "10.0.0.2"},
		{"serial, a spec that does not resolve", false, map[string]string{"prefill.svc": "10.0.0.3"}, fails, true, true, "decode.svc"},
		{"parallel dispatch, every spec seeded", true, map[string]string{"decode.svc": "10.0.0.2", "prefill.svc": "10.0.0.3"}, resolves, false, false, "10.0.0.2"},
		{"parallel dispatch, a spec not resolved yet", true, map[string]string{"decode.svc": "10.0.0.2"}, resolves, true, false, "10.0.0.2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lookups.Store(0)
			s := newState(t, c.parallel, 1, c.seed, c.lookup)
			u := split(t, s, "rid")
			step := u.PrepareStep()
			require.Equal(t, c.waits, step != nil, "a step before a lookup")
			if step != nil {
				step(context.Background())()
				require.NotNil(t, u.addrs, "the step's addresses are the split's")
			}
			before := lookups.Load()
			a := u.resolved()
			assert.Equal(t, before, lookups.Load(), "the legs build without a lookup")
			assert.Equal(t, c.wantPod, a.Pod)
			assert.Equal(t, c.waitsNext, split(t, s, "rid2").PrepareStep() != nil, "the next split's step")
		})
	}
}

// TestLegRank: with more than one data-parallel rank the legs carry the
// rank the request id picks, and the decode leg the one the prefill
// answer returned; with one rank, none.
func TestLegRank(t *testing.T) {
	seed := map[string]string{"decode.svc": "10.0.0.2", "prefill.svc": "10.0.0.3"}
	one := split(t, newState(t, false, 1, seed, nil), "rid")
	_, err := one.EditPrefill([]byte(`{"prompt":"x"}`))
	require.NoError(t, err)
	assert.Empty(t, one.LegRank())
	u := split(t, newState(t, false, 8, seed, nil), "rid")
	assert.Empty(t, u.LegRank(), "no rank before the legs are built")
	_, err = u.EditPrefill([]byte(`{"prompt":"x"}`))
	require.NoError(t, err)
	assert.NotEmpty(t, u.LegRank())
	_, err = u.EditDecodeParams([]byte(`{"remote_dp_rank":5,"remote_engine_id":"e"}`))
	require.NoError(t, err)
	assert.Equal(t, "5", u.LegRank(), "the rank the prefill answer returned")
}

// TestParallelLegs: parallel dispatch builds both legs itself, and the
// serial prefill edit leaves a body alone there (and the reverse).
func TestParallelLegs(t *testing.T) {
	seed := map[string]string{"decode.svc": "10.0.0.2", "prefill.svc": "10.0.0.3"}
	par := split(t, newState(t, true, 1, seed, nil), "rid")
	pre, dec, err := par.PairedLegs([]byte(`{"prompt":"x"}`), "10.0.0.1")
	require.NoError(t, err)
	assert.Contains(t, string(pre), "kv_transfer_params")
	assert.Contains(t, string(dec), "kv_transfer_params")
	body, err := par.EditPrefill([]byte(`{"prompt":"x"}`))
	require.NoError(t, err)
	assert.Equal(t, `{"prompt":"x"}`, string(body))
	ser := split(t, newState(t, false, 1, seed, nil), "rid")
	pre, dec, err = ser.PairedLegs([]byte(`{"prompt":"x"}`), "10.0.0.1")
	assert.NoError(t, err)
	assert.Nil(t, pre)
	assert.Nil(t, dec)
}
