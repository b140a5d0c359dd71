package kvpull

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// TestFailureOf: what a failed pull is to the split — the KV's source
// gone or its descriptor refused falls back as it is; anything else is a
// KV load failure; an agent's own words never reach the answer.
func TestFailureOf(t *testing.T) {
	engine := &upstream.UpstreamError{Role: upstream.RoleEngine, Reason: "refused", Err: errors.New("dial")}
	cases := []struct {
		name  string
		err   error
		load  bool
		agent bool // wrapped as the KV agent's, in fixed words
	}{
		{name: "none", err: nil},
		{name: "source gone", err: fmt.Errorf("agent: %w", kvtransfer.ErrKVSourceGone), agent: true},
		{name: "descriptor refused", err: fmt.Errorf("%w: remote_addr", connectors.ErrInvalidKVParams)},
		{name: "engine failed", err: engine, load: true},
		{name: "agent failed", err: errors.New("descriptor 10.0.0.1:7 quoted"), load: true, agent: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := failureOf(c.err)
			if c.err == nil {
				assert.NoError(t, got)
				return
			}
			assert.ErrorIs(t, got, c.err)
			var kl *feature.KVLoadError
			assert.Equal(t, c.load, errors.As(got, &kl))
			var ue *upstream.UpstreamError
			if assert.Equal(t, c.agent || errors.As(c.err, &ue), errors.As(got, &ue)) && c.agent {
				assert.Equal(t, upstream.RoleKVAgent, ue.Role)
				assert.NotContains(t, ue.Reason, "10.0.0.1")
			}
		})
	}
}
