package inference

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

// TestMoriIOLaneRule: a MoRI-IO split, serial or parallel dispatch, is the
// lane's once every host spec it names has an address (the loop may not
// wait on DNS); requests without a prefiller are never kept off for
// MoRI-IO.
func TestMoriIOLaneRule(t *testing.T) {
	resolves := func(context.Context, string) ([]string, error) { return []string{"10.9.0.1"}, nil }
	fails := func(context.Context, string) ([]string, error) { return nil, errors.New("no such host") }
	split, local := LaneHead{Split: true}, LaneHead{}
	for _, c := range []struct {
		name      string
		parallel  bool
		seed      map[string]string
		lookup    hostdns.LookupFunc
		splitOff  bool // before any lookup on the request path
		afterOff  bool // after one request resolved the specs
		wantNames []string
	}{
		{"serial, every spec seeded", false, map[string]string{"decode.svc": "10.0.0.2", "prefill.svc": "10.0.0.3"}, resolves, false, false,
			[]string{"MoRI-IO host specs not resolved yet"}},
		{"serial, a spec not resolved yet", false, map[string]string{"decode.svc": "10.0.0.2"}, resolves, true, false,
			[]string{"MoRI-IO host specs not resolved yet"}},
		{"serial, a spec that does not resolve", false, map[string]string{"decode.svc": "10.0.0.2"}, fails, true, true,
			[]string{"MoRI-IO host specs not resolved yet"}},
		{"parallel dispatch, every spec seeded", true, map[string]string{"decode.svc": "10.0.0.2", "prefill.svc": "10.0.0.3"}, resolves, false, false,
			[]string{"MoRI-IO host specs not resolved yet"}},
		{"parallel dispatch, a spec not resolved yet", true, map[string]string{"decode.svc": "10.0.0.2"}, resolves, true, false,
			[]string{"MoRI-IO host specs not resolved yet"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := moriProxy(t, c.parallel, 1, c.seed, c.lookup)
			assert.Equal(t, c.wantNames, p.OffLane())
			assert.False(t, p.KeepsOffLane(local), "a request served locally")
			assert.Equal(t, c.splitOff, p.KeepsOffLane(split), "before a lookup")
			p.Mori.Hosts(context.Background(), append([]string{p.Mori.Cfg.PodIP}, p.Mori.Cfg.RemoteHosts...))
			assert.Equal(t, c.afterOff, p.KeepsOffLane(split), "after a request resolved the specs")
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
