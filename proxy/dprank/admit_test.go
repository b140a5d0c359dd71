package dprank_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/dprank"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// head is a request head of one value per header.
type head map[string]string

func (h head) Peek(k string) []byte {
	if v, ok := h[k]; ok {
		return []byte(v)
	}
	return nil
}

func (h head) PeekAll(k string) [][]byte {
	if v := h.Peek(k); v != nil {
		return [][]byte{v}
	}
	return nil
}

// quiet is a request's logger that logs nothing.
type quiet struct{}

func (quiet) LogAt(zerolog.Level) *zerolog.Event { return nil }
func (quiet) Logger() *zerolog.Logger            { l := zerolog.Nop(); return &l }

// TestPickerAdmit: a request whose x-data-parallel-host-port names one of
// the pod's ranks is decoded by that rank's engine, whichever rank's port
// it arrived on; one without the header keeps its own; an unknown value
// is counted and refuses the request.
func TestPickerAdmit(t *testing.T) {
	for _, tc := range []struct {
		name, header string
		local        string // the request's engine after admission
		routed       bool
		rejected     float64
	}{
		{name: "no header", local: "engine:9000"},
		{name: "another rank", header: "10.0.0.5:8001", local: "engine:9001", routed: true},
		{name: "its own rank", header: "10.0.0.5:8000", local: "engine:9000", routed: true},
		{name: "unknown rank", header: "10.0.0.5:8002", local: "engine:9000", rejected: 1},
		{name: "not host:port", header: "rank1", local: "engine:9000", rejected: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rejected := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rejected"}, []string{"reason"})
			p := dprank.Picker{Pod: dprank.Pod{Port: 8000, Size: 2, PodIP: "10.0.0.5"},
				Engines: []string{"engine:9000", "engine:9001"}, Rejected: rejected}
			h := head{}
			if tc.header != "" {
				h[dprank.Header] = tc.header
			}
			a := &feature.Admission{Local: "engine:9000", Log: quiet{}}
			step, err := p.Admit(a, h)
			assert.Nil(t, step)
			if tc.rejected > 0 {
				require.ErrorIs(t, err, dprank.ErrUnknown)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.local, a.Local)
			assert.Equal(t, tc.routed, a.Routed)
			assert.Equal(t, tc.rejected, testutil.ToFloat64(rejected.WithLabelValues(metrics.RejectUnknownRank)))
		})
	}
}
