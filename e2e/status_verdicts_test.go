package e2e

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/status"
)

// TestStatusVerdictsFromRealTraffic: each verdict of /debug/pd (and
// `pd-sidecar status`) from one class of real traffic, each on a fresh
// sidecar so that its window holds that class alone, and the window's
// outcomes always sum to the requests that named a prefiller. A request
// counts as split only when the decode engine's proof counter says a
// decode ran on moved KV.
func TestStatusVerdictsFromRealTraffic(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	refusing := harness.StartEngineSim(t, "prefill")
	setFault(t, refusing, `{"status":400}`)
	split := map[string]string{"x-prefiller-host-port": prefill.HostPort()}
	dead := map[string]string{"x-prefiller-host-port": harness.HostPort(harness.FreePort(t))}
	type send struct {
		hdr  map[string]string
		code int
	}
	tests := []struct {
		name    string
		sends   []send // each with the status the client must get
		verdict string
		summary string
		want    status.Counts // the outcome fields only
	}{
		{name: "idle", verdict: status.VerdictIdle, summary: "no inference requests"},
		{name: "no prefiller named", sends: []send{{nil, 200}, {nil, 200}}, verdict: status.VerdictNotConfigured, summary: "none named a prefiller"},
		{name: "prefill answered 400", sends: []send{{map[string]string{"x-prefiller-host-port": refusing.HostPort()}, 400}},
			verdict: status.VerdictNotOperating, summary: "1 answered 4xx", want: status.Counts{NamedPrefiller: 1, Refused: 1}},
		{name: "a header naming nothing usable", sends: []send{{map[string]string{"x-prefiller-host-port": "not-a-host-port"}, 200}},
			verdict: status.VerdictNotOperating, summary: "1 fell back to local prefill", want: status.Counts{NamedPrefiller: 1, FellBack: 1}},
		{name: "dead prefiller", sends: []send{{dead, 200}}, verdict: status.VerdictNotOperating, summary: "unreachable: 1",
			want: status.Counts{NamedPrefiller: 1, FellBack: 1}},
		{name: "splits", sends: []send{{split, 200}, {split, 200}, {nil, 200}}, verdict: status.VerdictOperating,
			summary: "2 of 2 requests that named a prefiller", want: status.Counts{NamedPrefiller: 2, Split: 2}},
		{name: "splits and a 4xx", sends: []send{{split, 200}, {map[string]string{"x-prefiller-host-port": refusing.HostPort()}, 400}},
			verdict: status.VerdictOperating, summary: "the others: 1 answered 4xx", want: status.Counts{NamedPrefiller: 2, Split: 1, Refused: 1}},
		{name: "splits and a fallback", sends: []send{{split, 200}, {dead, 200}}, verdict: status.VerdictDegraded,
			summary: "1 of 2 requests that named a prefiller", want: status.Counts{NamedPrefiller: 2, Split: 1, FellBack: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc := harness.StartSidecar(t, decode.Port)
			before := decode.Metric(t, "sim_remote_kv_decodes_total", nil)
			for _, s := range tc.sends {
				st, b, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":3`), s.hdr)
				require.Equal(t, s.code, st, "%s", b)
			}
			snap, err := status.Fetch(context.Background(), nil, sc.URL())
			require.NoError(t, err)
			w := snap.Window
			assert.Equal(t, tc.verdict, snap.Verdict, snap.Summary)
			assert.Contains(t, snap.Summary, tc.summary)
			assert.Equal(t, tc.want.NamedPrefiller, w.NamedPrefiller)
			assert.Equal(t, tc.want.Split, w.Split)
			assert.Equal(t, tc.want.Refused, w.Refused)
			assert.Equal(t, tc.want.FellBack, w.FellBack)
			assert.Equal(t, w.NamedPrefiller, w.Split+w.NoHandoff+w.FellBack+w.Refused+w.NamedFailed, "the outcomes sum to the named requests")
			assert.Equal(t, float64(w.Split), decode.Metric(t, "sim_remote_kv_decodes_total", nil)-before, "a split is a decode on moved KV")
		})
	}
}
