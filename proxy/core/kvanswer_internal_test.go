package core

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// TestKVAnswerMeaning: what the decode leg's first answer says of the KV
// handoff, the one place both drivers ask: a 500 (or a stream's error event
// before any output) is a KV load failure, counted, marked for the split to
// recover from and the handoff let go, unless --on-kv-load-failure error
// passes the engine's answer on; anything else is relayed.
func TestKVAnswerMeaning(t *testing.T) {
	cases := []struct {
		name       string
		policy     string
		status     int  // KVAnswered's (0: KVStreamed)
		errorEvent bool // KVStreamed's
		recover    bool // a failure marked Recoverable is returned
		counted    float64
	}{
		{name: "200", policy: KVFailLocalPrefill, status: http.StatusOK},
		{name: "400 relayed", policy: KVFailLocalPrefill, status: http.StatusBadRequest},
		{name: "500 recovered", policy: KVFailLocalPrefill, status: http.StatusInternalServerError, recover: true, counted: 1},
		{name: "500 passed on", policy: KVFailError, status: http.StatusInternalServerError, counted: 1},
		{name: "stream output", policy: KVFailLocalPrefill},
		{name: "stream error event recovered", policy: KVFailLocalPrefill, errorEvent: true, recover: true, counted: 1},
		{name: "stream error event passed on", policy: KVFailError, errorEvent: true, counted: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.OnKVLoadFailure = tc.policy
			m := metrics.New(prometheus.NewRegistry(), 0)
			p, err := NewSidecar(cfg, nixlv2.New(), m, zerolog.Nop())
			require.NoError(t, err)
			r := &Request{P: p, Label: "p"}
			r.Handoff = &connectors.Handoff{}
			if tc.status != 0 {
				err = r.KVAnswered(time.Now(), tc.status)
			} else {
				err = r.KVStreamed(time.Now(), tc.errorEvent)
			}
			assert.Equal(t, tc.recover, err != nil && split.Recovers(err))
			assert.Equal(t, tc.recover, errors.Is(err, ErrKVLoadFailed))
			assert.Equal(t, tc.recover, r.Handoff == nil, "the handoff is let go only when recovered from")
			assert.Equal(t, tc.counted, testutil.ToFloat64(m.KVLoadFailures.WithLabelValues("p")))
		})
	}
}
