package inference

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

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/hostdns"
)

// moriProxy is a proxy in MoRI-IO write mode whose host specs resolve
// through lookup; seed holds those resolved at start-up.
func moriProxy(t *testing.T, parallel bool, dp int, seed map[string]string, lookup hostdns.LookupFunc) *Proxy {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MoriIO = MoriIOConfig{WriteMode: true, ParallelDispatch: parallel, PodIP: "decode.svc",
		RemoteHosts: []string{"10.0.0.1", "prefill.svc"}, Ports: moriio.Ports{DPSize: dp, TPSize: 1},
		WaitTimeout: time.Second, DNSTTL: time.Minute, DNSTimeout: time.Second, Seed: seed, Lookup: lookup}
	p, err := New(cfg, nixlv2.New(), metrics.New(prometheus.NewRegistry(), 0), prometheus.NewRegistry(), zerolog.Nop())
	require.NoError(t, err)
	return p
}

// TestMoriIOResolveStep: a MoRI-IO split, serial or parallel dispatch,
// whose host specs do not all have an address yet waits on their
// resolution as a step of its admission, run off the event loop (or on
// fasthttp's goroutine); its legs then name what the step resolved, and
// build without waiting on DNS. A split whose specs all have an address
// has no step.
func TestMoriIOResolveStep(t *testing.T) {
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
			p := moriProxy(t, c.parallel, 1, c.seed, c.lookup)
			r := p.StartRequest([]byte("rid"), nil, []byte(`{}`), "127.0.0.1:1", connectors.APICompletions)
			step := p.moriResolveStep(r)
			require.Equal(t, c.waits, step != nil, "a step before a lookup")
			if step != nil {
				step(context.Background())()
				require.NotNil(t, r.moriAddrs, "the step's addresses are the request's")
			}
			before := lookups.Load()
			a := p.Mori.addrs(r)
			assert.Equal(t, before, lookups.Load(), "the legs build without a lookup")
			assert.Equal(t, c.wantPod, a.pod)
			next := p.StartRequest([]byte("rid2"), nil, []byte(`{}`), "127.0.0.1:1", connectors.APICompletions)
			assert.Equal(t, c.waitsNext, p.moriResolveStep(next) != nil, "the next split's step")
		})
	}
}

// TestMoriIOStrips: with more than one data-parallel rank MoRI-IO sets the
// rank header of a split's legs, so the lane leaves the client's out of
// them (and only of them).
func TestMoriIOStrips(t *testing.T) {
	seed := map[string]string{"decode.svc": "10.0.0.2", "prefill.svc": "10.0.0.3"}
	one := moriProxy(t, false, 1, seed, nil)
	assert.NotContains(t, one.SplitStrip, moriio.HeaderRank, "one rank: no header set, the client's passes")
	eight := moriProxy(t, false, 8, seed, nil)
	assert.Contains(t, eight.SplitStrip, moriio.HeaderRank)
	assert.Contains(t, eight.PrefillStrip, moriio.HeaderRank)
	assert.NotContains(t, eight.LegStrip, moriio.HeaderRank, "a local request's legs keep it")
}
