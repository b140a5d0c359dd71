package inference

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/connectors/sglang"
)

// TestChunkPlan: which decodes a chunked decode applies to, on either
// driver; how their bodies are cut is chunked.PlanFor's (its own tests).
func TestChunkPlan(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name     string
		n        int
		api      connectors.API
		conn     connectors.Connector
		remote   bool
		dpRouted bool
		body     string
		chunk    bool
		size     int
		budget   int
	}{
		{name: "off", n: 0, body: `{` + msgs + `,"max_tokens":100}`},
		{name: "not chat", n: 4, api: connectors.APICompletions, body: `{"prompt":"x","max_tokens":100}`},
		{name: "budget fits one chunk", n: 4, body: `{` + msgs + `,"max_tokens":4}`},
		{name: "max_tokens budget", n: 4, body: `{` + msgs + `,"max_tokens":10}`, chunk: true, size: 4, budget: 10},
		{name: "data-parallel routed", n: 4, dpRouted: true, body: `{` + msgs + `,"max_tokens":10}`},
		{name: "a nixlv2 split's decode", n: 4, remote: true, body: `{` + msgs + `,"max_tokens":10}`, chunk: true, size: 4, budget: 10},
		{name: "another connector's decode leg", n: 4, conn: sglang.New(8998), remote: true, body: `{` + msgs + `,"max_tokens":10}`},
		{name: "another connector's local fallback", n: 4, conn: sglang.New(8998), body: `{` + msgs + `,"max_tokens":10}`, chunk: true, size: 4, budget: 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DecodeChunkSize = tc.n
			conn := tc.conn
			if conn == nil {
				conn = nixlv2.New()
			}
			api := tc.api
			if api == 0 {
				api = connectors.APIChat
			}
			r := &Request{P: &Proxy{Cfg: cfg, Conn: conn}, API: api, dpRouted: tc.dpRouted}
			plan, ok := r.ChunkPlan([]byte(tc.body), tc.remote)
			require.Equal(t, tc.chunk, ok)
			if ok {
				assert.Equal(t, tc.size, plan.Size())
				assert.Equal(t, tc.budget, plan.Budget())
			}
		})
	}
}
