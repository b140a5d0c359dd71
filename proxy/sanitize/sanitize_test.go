package sanitize_test

import (
	"bytes"
	"errors"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/sanitize"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// errBadRequest stands for the request path's 400 (Cleaner.BadRequest).
var errBadRequest = failure.New("bad request body", failure.Outcome{Status: http.StatusBadRequest})

// allowOnly admits one address.
type allowOnly string

func (a allowOnly) Allowed(hp string) bool { return hp == string(a) }

// testLog is a request's logger writing to a buffer at debug level.
type testLog struct{ lg zerolog.Logger }

func (l *testLog) LogAt(lv zerolog.Level) *zerolog.Event { return l.lg.WithLevel(lv) }
func (l *testLog) Logger() *zerolog.Logger               { return &l.lg }

// TestCleanerAdmit: the admission's body becomes what may reach an engine
// and its stream flags are read from it; a body that is not a well-formed
// object, or that decoders read differently, or (trusted) names an
// address the allowlist refuses, refuses the request, counted by reason;
// removed fields are counted by name and logged.
func TestCleanerAdmit(t *testing.T) {
	const kv = `{"remote_host":"10.0.0.9","remote_port":5600}`
	for _, tc := range []struct {
		name          string
		trust         bool
		allowlist     ssrf.Allowlist
		body          string
		want          string // the body after admission ("": refused)
		stream, usage bool
		status        int    // of a refusal's outcome
		rejected      string // the reason counted
		sanitized     string // the field counted and logged
	}{
		{name: "plain", body: `{"model":"m","prompt":"hi"}`, want: `{"model":"m","prompt":"hi"}`},
		{name: "stream flags", body: `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`,
			want: `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, stream: true, usage: true},
		{name: "client connector field removed", body: `{"model":"m","kv_transfer_params":` + kv + `,"prompt":"hi"}`,
			want: `{"model":"m","prompt":"hi"}`, sanitized: "kv_transfer_params"},
		{name: "not an object", body: `[1]`, status: 400, rejected: metrics.RejectMalformed},
		{name: "malformed", body: `{"model":`, status: 400, rejected: metrics.RejectMalformed},
		{name: "ambiguous", body: `{"stream":true,"stream":false}`, status: 400, rejected: metrics.RejectAmbiguousJSON},
		{name: "trusted, no allowlist", trust: true, body: `{"kv_transfer_params":` + kv + `}`, want: `{"kv_transfer_params":` + kv + `}`},
		{name: "trusted, allowed", trust: true, allowlist: allowOnly("10.0.0.9:5600"), body: `{"kv_transfer_params":` + kv + `}`,
			want: `{"kv_transfer_params":` + kv + `}`},
		{name: "trusted, denied", trust: true, allowlist: allowOnly("10.0.0.1:5600"), body: `{"kv_transfer_params":` + kv + `}`,
			status: 403, rejected: metrics.RejectSSRF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := metrics.NewGuards(prometheus.NewRegistry())
			c := &sanitize.Cleaner{TrustClientKVParams: tc.trust, Allowlist: tc.allowlist, Guards: g, BadRequest: errBadRequest}
			var logged bytes.Buffer
			a := &feature.Admission{API: connectors.APIChat, Body: []byte(tc.body), Log: &testLog{lg: zerolog.New(&logged)}}
			step, err := c.Admit(a, nil)
			assert.Nil(t, step)
			if tc.want == "" {
				require.Error(t, err)
				assert.Equal(t, tc.status, failure.Of(err).Status, "%v", err)
				assert.Equal(t, tc.status == 403, errors.Is(err, sanitize.ErrKVAddressDenied), "%v", err)
				assert.Equal(t, tc.status == 400, errors.Is(err, errBadRequest), "%v", err)
			} else {
				require.NoError(t, err)
				assert.JSONEq(t, tc.want, string(a.Body))
				assert.Equal(t, tc.stream, a.Stream)
				assert.Equal(t, tc.usage, a.Usage)
			}
			rejected := 0
			for _, reason := range []string{metrics.RejectMalformed, metrics.RejectAmbiguousJSON, metrics.RejectSSRF} {
				n := int(testutil.ToFloat64(g.Rejected.WithLabelValues(reason)))
				if reason == tc.rejected {
					assert.Equal(t, 1, n, reason)
				}
				rejected += n
			}
			assert.Equal(t, min(1, len(tc.rejected)), rejected)
			for _, f := range metrics.SanitizedFields {
				want := 0.0
				if f == tc.sanitized {
					want = 1
				}
				assert.Equal(t, want, testutil.ToFloat64(g.Sanitized.WithLabelValues(f)), f)
			}
			if tc.sanitized != "" {
				assert.Contains(t, logged.String(), "client connector fields removed from the body")
				assert.Contains(t, logged.String(), tc.sanitized)
			} else {
				assert.Empty(t, logged.String())
			}
		})
	}
}
