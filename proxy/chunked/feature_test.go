package chunked_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/chunked"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// TestFeaturePlans: which decodes chunked decode applies to, on either
// driver; how their bodies are cut is PlanFor's (its own tests).
func TestFeaturePlans(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name       string
		n          int
		api        connectors.API
		remoteConn bool // the connector's split decode may be chunked (nixlv2)
		remote     bool
		routed     bool
		refused    bool
		body       string
		chunk      bool
		size       int
		budget     int
	}{
		{name: "off", n: 0, remoteConn: true, body: `{` + msgs + `,"max_tokens":100}`},
		{name: "not chat", n: 4, api: connectors.APICompletions, body: `{"prompt":"x","max_tokens":100}`},
		{name: "budget fits one chunk", n: 4, body: `{` + msgs + `,"max_tokens":4}`},
		{name: "max_tokens budget", n: 4, body: `{` + msgs + `,"max_tokens":10}`, chunk: true, size: 4, budget: 10},
		{name: "data-parallel routed", n: 4, routed: true, body: `{` + msgs + `,"max_tokens":10}`},
		{name: "a nixlv2 split's decode", n: 4, remoteConn: true, remote: true, body: `{` + msgs + `,"max_tokens":10}`, chunk: true, size: 4, budget: 10},
		{name: "another connector's decode leg", n: 4, remote: true, body: `{` + msgs + `,"max_tokens":10}`},
		{name: "another connector's local fallback", n: 4, body: `{` + msgs + `,"max_tokens":10}`, chunk: true, size: 4, budget: 10},
		{name: "a refused prefiller's fallback", n: 4, refused: true, body: `{` + msgs + `,"max_tokens":10}`, chunk: true, size: 4, budget: 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api := tc.api
			if api == 0 {
				api = connectors.APIChat
			}
			var u feature.Uses
			u.Begin([]feature.Feature{chunked.Feature{Size: tc.n, Remote: tc.remoteConn}},
				feature.Request{API: api, Routed: tc.routed, Refused: tc.refused}, nil)
			var plan chunked.Plan
			ok := false
			for use := range u.All() {
				if p, is := use.(chunked.Planner); is {
					plan, ok = p.ChunkPlan([]byte(tc.body), tc.remote)
				}
			}
			require.Equal(t, tc.chunk, ok)
			if ok {
				assert.Equal(t, tc.size, plan.Size())
				assert.Equal(t, tc.budget, plan.Budget())
			}
		})
	}
}
