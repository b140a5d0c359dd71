package core

import (
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
	"github.com/pd-sidecar/pd-sidecar/proxy/moriwrite"
)

// moriProxy is a proxy in MoRI-IO write mode whose host specs resolve
// through lookup; seed holds those resolved at start-up.
func moriProxy(t *testing.T, parallel bool, dp int, seed map[string]string, lookup hostdns.LookupFunc) *Sidecar {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MoriIO = moriwrite.Config{WriteMode: true, ParallelDispatch: parallel, PodIP: "decode.svc",
		RemoteHosts: []string{"10.0.0.1", "prefill.svc"}, Ports: moriio.Ports{DPSize: dp, TPSize: 1},
		WaitTimeout: time.Second, DNSTTL: time.Minute, DNSTimeout: time.Second, Seed: seed, Lookup: lookup}
	p, err := NewSidecar(cfg, nixlv2.New(), metrics.New(prometheus.NewRegistry(), 0), zerolog.Nop())
	require.NoError(t, err)
	return p
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
