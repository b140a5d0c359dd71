package core

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

func allowlistProxy(t *testing.T, entries ...string) *Sidecar {
	t.Helper()
	cfg := DefaultConfig()
	if entries != nil {
		al, err := ssrf.ParseStatic(entries)
		require.NoError(t, err)
		cfg.Guard.Allowlist = al
	}
	p, err := NewSidecar(cfg, nixlv2.New(), metrics.New(prometheus.NewRegistry(), 0), zerolog.Nop())
	require.NoError(t, err)
	return p
}

// TestCheckHandoffAddrs: with SSRF protection, an address a prefill answer
// names passes on the prefiller's own host (any port) or on the allowlist,
// and nowhere else; without it, anywhere.
func TestCheckHandoffAddrs(t *testing.T) {
	on := allowlistProxy(t, "10.0.0.9:8000", "10.1.0.0/16", "side.example:5600", "[fd00::9]:8000")
	off := allowlistProxy(t)
	addr := func(h string, port int) []connectors.Addr {
		return []connectors.Addr{{Field: "kv_transfer_params.remote_host", Host: h, Port: port}}
	}
	for _, tc := range []struct {
		name      string
		prefiller string
		addrs     []connectors.Addr
		ok        bool
	}{
		{"the prefiller's host, another port", "10.0.0.9:8000", addr("10.0.0.9", 5600), true},
		{"the prefiller's host, no port", "10.0.0.9:8000", addr("10.0.0.9", 0), true},
		{"an IPv4-mapped spelling of it", "10.0.0.9:8000", addr("::ffff:10.0.0.9", 5600), true},
		{"the prefiller's IPv6 host", "[fd00::9]:8000", addr("fd00:0::9", 5600), true},
		{"an allowlisted CIDR", "10.0.0.9:8000", addr("10.1.2.3", 5600), true},
		{"an allowlisted name and port", "10.0.0.9:8000", addr("side.example", 5600), true},
		{"the same name, other case", "Prefill.Example:8000", addr("prefill.example.", 1), true},
		{"nothing named", "10.0.0.9:8000", nil, true},

		{"another host", "10.0.0.9:8000", addr("10.0.0.10", 5600), false},
		{"loopback", "10.0.0.9:8000", addr("127.0.0.1", 5600), false},
		{"an allowlisted name at another port: the prefiller's host instead", "10.0.0.9:8000", addr("side.example", 5601), true},
		{"another host without a port", "10.0.0.9:8000", addr("10.1.2.3", 0), false},
		{"a name for the prefiller's address: its host instead", "10.0.0.9:8000", addr("prefill.example", 5600), true},
		{"the second of two refused", "10.0.0.9:8000", append(addr("10.0.0.9", 5600), connectors.Addr{Field: "kv_transfer_params.remote_hosts", Host: "10.9.9.9", Port: 5600}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := on.checkHandoff(tc.prefiller, connectors.Handoff{Addrs: tc.addrs})
			assert.NoError(t, off.handoffAllowed(tc.prefiller, connectors.Handoff{Addrs: tc.addrs}), "no SSRF protection: anything")
			if tc.ok {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, connectors.ErrInvalidKVParams)
			assert.Equal(t, failure.ReasonInvalidParams, failure.Of(err).Reason, "a local fallback")
			assert.NotContains(t, err.Error(), tc.addrs[len(tc.addrs)-1].Host, "the address is not quoted")
		})
	}
}

// TestPrefillAnsweredChecksAddrs: the one place both paths read a prefill
// answer refuses a handoff naming a host off the allowlist, and keeps
// nothing of it for a release leg.
func TestPrefillAnsweredChecksAddrs(t *testing.T) {
	p := allowlistProxy(t, "10.0.0.9:8000")
	r := &Request{P: p, Prefiller: "10.0.0.9:8000", API: connectors.APICompletions}
	answer := func(host string) []byte {
		return []byte(`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,` +
			`"remote_block_ids":[[1]],"remote_engine_id":"e","remote_request_id":"r","remote_host":"` + host + `","remote_port":5600}}`)
	}
	s := BeginSequential(r)
	res, err := s.PrefillAnswered(200, []byte("application/json"), answer("10.0.0.9"))
	require.NoError(t, err)
	assert.Equal(t, []connectors.Addr{{Field: "kv_transfer_params.remote_host", Host: "10.0.0.9", Port: 5600}}, res.Handoff.Addrs)

	r.KVPending = nil
	res, err = s.PrefillAnswered(200, []byte("application/json"), answer("10.0.0.66"))
	require.ErrorIs(t, err, connectors.ErrInvalidKVParams)
	assert.Nil(t, res.Handoff.Params)
	assert.Nil(t, r.KVPending, "no release leg for a refused handoff")
}

// TestSideChannelNameReplaced: a side-channel host given as a name other
// than the prefiller's, not allowlisted at its port, is handed on as the
// prefiller's own host (counted); an allowlisted name and an address are
// not touched.
func TestSideChannelNameReplaced(t *testing.T) {
	on := allowlistProxy(t, "10.0.0.9:8000", "side.example:5600")
	for _, tc := range []struct {
		name, host, want string
		replaced         float64
	}{
		{"vLLM's default", "localhost", "10.0.0.9", 1},
		{"llm-d-inference-sim's placeholder", "DUMMY", "10.0.0.9", 1},
		{"the pod's DNS name", "prefill-0.pool.svc", "10.0.0.9", 1},
		{"an allowlisted name", "side.example", "side.example", 0},
		{"the prefiller's own address", "10.0.0.9", "10.0.0.9", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := on.M.Wire.HostsReplaced.WithLabelValues("nixlv2", "remote_host")
			before := testutil.ToFloat64(m)
			h := connectors.Handoff{
				Params: []byte(`{"do_remote_prefill":true,"remote_host":"` + tc.host + `","remote_port":5600}`),
				Addrs:  []connectors.Addr{{Field: "kv_transfer_params.remote_host", Host: tc.host, Port: 5600}},
			}
			got, err := on.checkHandoff("10.0.0.9:8000", h)
			require.NoError(t, err)
			assert.Equal(t, tc.want, gjson.GetBytes(got.Params, "remote_host").Str)
			assert.Equal(t, tc.want, got.Addrs[0].Host)
			assert.Equal(t, tc.replaced, testutil.ToFloat64(m)-before)
		})
	}
}
