package relay

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
)

func chunkTestRequest(n int, api connectors.API, header ...string) *inference.Request {
	cfg := inference.DefaultConfig()
	cfg.DecodeChunkSize = n
	rc := &fasthttp.RequestCtx{}
	for i := 0; i+1 < len(header); i += 2 {
		rc.Request.Header.Set(header[i], header[i+1])
	}
	return &inference.Request{P: &inference.Proxy{Cfg: cfg}, RC: rc, API: api}
}

// TestChunkPlan: which requests a chunked decode applies to; how their
// bodies are cut is chunked.PlanFor's (its own tests).
func TestChunkPlan(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name   string
		n      int
		api    connectors.API
		body   string
		header []string
		chunk  bool
		size   int
		budget int
	}{
		{name: "off", n: 0, body: `{` + msgs + `,"max_tokens":100}`},
		{name: "not chat", n: 4, api: connectors.APICompletions, body: `{"prompt":"x","max_tokens":100}`},
		{name: "budget fits one chunk", n: 4, body: `{` + msgs + `,"max_tokens":4}`},
		{name: "max_tokens budget", n: 4, body: `{` + msgs + `,"max_tokens":10}`, chunk: true, size: 4, budget: 10},
		{name: "data-parallel routed", n: 4, body: `{` + msgs + `,"max_tokens":10}`, header: []string{inference.HeaderDataParallel, "10.0.0.1:8001"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api := tc.api
			if api == 0 {
				api = connectors.APIChat
			}
			plan, ok := chunkPlanFor(chunkTestRequest(tc.n, api, tc.header...), []byte(tc.body), false)
			require.Equal(t, tc.chunk, ok)
			if ok {
				assert.Equal(t, tc.size, plan.Size())
				assert.Equal(t, tc.budget, plan.Budget())
			}
		})
	}
}
