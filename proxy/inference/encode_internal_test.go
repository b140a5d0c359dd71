package inference

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
)

// TestEncoderErrorsClassified: every encoder-stage failure is answered
// 502, but one wrapping a client body no leg can be built of (400).
func TestEncoderErrorsClassified(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
	}{
		{encoder.ErrNoneAllowed, 502},
		{fmt.Errorf("%w for item 1: %w", encoder.ErrFailed, encoder.ErrTimeout), 502},
		{fmt.Errorf("%w for item 0: %w", encoder.ErrFailed, fmt.Errorf("%w: %w", ErrBadRequest, connectors.ErrBadBody)), 400},
	} {
		assert.Equal(t, tc.status, failure.Of(tc.err).Status, "%v", tc.err)
	}
}

func encodeProxy(t *testing.T, edit func(*encoder.Config)) *Proxy {
	cfg := DefaultConfig()
	cfg.Encoder.Connector = connectors.ECNixl
	edit(&cfg.Encoder)
	p, err := New(cfg, nixlv2.New(), metrics.New(prometheus.NewRegistry(), 0), prometheus.NewRegistry(), zerolog.Nop())
	require.NoError(t, err)
	return p
}

// TestEncodeRequest: a request naming encoders goes through the stage
// (encoder.Stage): its body continues as the stage leaves it, and its
// report says the stage's outcome, none when its client left.
func TestEncodeRequest(t *testing.T) {
	const image = `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u0"}}]}]}`
	for _, tc := range []struct {
		name, body, encoders, policy string
		gone                         bool
		outcome                      string
		err                          error
		threshold                    bool // the body continues with cache_hit_threshold 0
	}{
		{name: "no header", body: image},
		{name: "no items", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, encoders: "127.0.0.1:1", outcome: metrics.StageNoItems},
		{name: "none allowed", body: image, encoders: "nohost", outcome: metrics.StageFailed, err: encoder.ErrNoneAllowed},
		{name: "none allowed, local", body: image, encoders: "nohost", policy: encoder.FailLocal, outcome: metrics.StageDegraded, threshold: true},
		{name: "client gone", body: image, encoders: "nohost", gone: true, err: ErrClientGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := encodeProxy(t, func(c *encoder.Config) {
				if tc.policy != "" {
					c.OnFailure = tc.policy
				}
			})
			var rc fasthttp.RequestCtx
			if tc.encoders != "" {
				rc.Request.Header.Set(HeaderEncoders, tc.encoders)
			}
			r := p.StartRequest([]byte("rid"), &rc.Request.Header, []byte(tc.body), "127.0.0.1:1", connectors.APIChat)
			defer r.Cancel(context.Canceled)
			if tc.gone {
				r.Cancel(ErrClientGone)
			}
			if step := encodeStep(r, &rc.Request.Header); step != nil {
				step(r.Ctx)()
			}
			err := r.admitErr
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.outcome, r.Obs.Encoder)
			assert.Equal(t, tc.threshold, gjson.GetBytes(r.Body, "cache_hit_threshold").Raw == "0", "%s", r.Body)
		})
	}
}
