package kvsource

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// quiet logs nothing.
type quiet struct{}

func (quiet) LogAt(zerolog.Level) *zerolog.Event { return nil }

// TestFeatureNamesSource: a usable x-kv-cache-source-host-port becomes the
// request's source (its P2P port derived from its HTTP port), every
// outcome but "no header" is counted, and a source not used names nothing.
func TestFeatureNamesSource(t *testing.T) {
	for _, tc := range []struct {
		name, header, prefiller string
		outcome                 string // "" none counted
		peer                    *connectors.P2PPeer
	}{
		{"no header", "", "", "", nil},
		{"used, rank 1's port", "10.0.0.9:8001", "10.0.0.2:8000", metrics.KVSourceUsed, &connectors.P2PPeer{RequestID: "id", Host: "10.0.0.9", Port: 7778}},
		{"the prefiller itself", "10.0.0.2:8000", "10.0.0.2:8000", metrics.KVSourcePrefiller, nil},
		{"malformed", "not a host:port:x", "", metrics.KVSourceMalformed, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"outcome"})
			f := Feature{Ports: Ports{HTTP: 8000, Ranks: 2, P2P: 7777}, OwnHost: func(string) bool { return false },
				Outcomes: outcomes, NewID: func() string { return "id" }}
			var h fasthttp.RequestHeader
			if tc.header != "" {
				h.Set(Header, tc.header)
			}
			u := f.Begin(feature.Request{API: connectors.APIChat, Prefiller: tc.prefiller, Port: 8000, Log: quiet{}}, &h)
			if tc.outcome != "" {
				assert.Equal(t, 1.0, testutil.ToFloat64(outcomes.WithLabelValues(tc.outcome)))
			}
			assert.Equal(t, map[bool]int{true: 0, false: 1}[tc.outcome == ""], testutil.CollectAndCount(outcomes))
			if tc.peer == nil {
				assert.Nil(t, u)
				return
			}
			n, ok := u.(feature.KVSourceNamer)
			require.True(t, ok)
			assert.Equal(t, tc.peer, n.KVSource())
			e, ok := u.(feature.PrefillEditor)
			require.True(t, ok)
			body, err := e.EditPrefill([]byte(`{"model":"m","prompt":"p"}`))
			require.NoError(t, err)
			assert.Contains(t, string(body), `"remote_kv_source"`)
		})
	}
}
