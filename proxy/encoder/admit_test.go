package encoder

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
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
	if v, ok := h[k]; ok {
		return [][]byte{[]byte(v)}
	}
	return nil
}

// testLog is a request's logger that logs nothing.
type testLog struct{ lg zerolog.Logger }

func (l *testLog) LogAt(zerolog.Level) *zerolog.Event { return nil }
func (l *testLog) Logger() *zerolog.Logger            { return &l.lg }

// spans counts the leg spans asked for, by name.
type spans struct{ encode atomic.Int32 }

func (s *spans) Child(name string, _ trace.SpanKind) (context.Context, trace.Span) {
	if name == LegSpan {
		s.encode.Add(1)
	}
	return nil, nil
}

func (s *spans) InjectSpan(context.Context, feature.HeaderSetter) {}

var errClientGone = errors.New("client gone")

// TestAdmit: a request naming encoders waits on the stage (a step) run on
// a copy of its body: the body then continues as the stage leaves it, and
// the admission says the stage's outcome, none when the client left; a
// failure refuses the request under --on-encoder-failure error.
func TestAdmit(t *testing.T) {
	const image = `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u0"}}]}]}`
	enc := (&fakeEncoder{name: "a"}).serve(t)
	for _, tc := range []struct {
		name, body, encoders, policy string
		gone                         bool
		step                         bool // the admission waits on the stage
		outcome                      string
		err                          error
		threshold                    bool // the body continues with cache_hit_threshold 0
		spans                        int32
	}{
		{name: "no header", body: image},
		{name: "no items", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, encoders: "127.0.0.1:1", step: true, outcome: metrics.StageNoItems},
		{name: "encoded", body: image, encoders: enc, step: true, outcome: metrics.StageEncoded, threshold: true, spans: 1},
		{name: "none allowed", body: image, encoders: "nohost", step: true, outcome: metrics.StageFailed, err: ErrNoneAllowed},
		{name: "none allowed, local", body: image, encoders: "nohost", policy: FailLocal, step: true, outcome: metrics.StageDegraded, threshold: true},
		{name: "client gone", body: image, encoders: "nohost", gone: true, step: true, err: errClientGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testStage(t, func(d *Deps) {
				if tc.policy != "" {
					d.Config.OnFailure = tc.policy
				}
			})
			h := head{}
			if tc.encoders != "" {
				h[Header] = tc.encoders
			}
			tr := &spans{}
			client := []byte(tc.body)
			a := &feature.Admission{API: connectors.APIChat, ID: "rid", Body: client, Log: &testLog{lg: zerolog.Nop()}, Trace: tr}
			step, err := s.Admit(a, h)
			require.NoError(t, err)
			require.Equal(t, tc.step, step != nil)
			if step == nil {
				assert.Equal(t, tc.body, string(a.Body))
				return
			}
			// The driver may reuse the client's bytes once Admit returned:
			// the stage runs on its copy.
			copy(client, bytes.Repeat([]byte{'x'}, len(client)))
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(context.Canceled)
			if tc.gone {
				cancel(errClientGone)
			}
			step(ctx)()
			if tc.err != nil {
				require.ErrorIs(t, a.Refusal, tc.err)
			} else {
				require.NoError(t, a.Refusal)
				assert.False(t, strings.Contains(string(a.Body), "xxx"), "%s", a.Body)
				assert.Equal(t, "m", gjson.GetBytes(a.Body, "model").String(), "%s", a.Body)
			}
			assert.Equal(t, tc.outcome, a.Encoded)
			assert.Equal(t, tc.threshold, gjson.GetBytes(a.Body, "cache_hit_threshold").Raw == "0", "%s", a.Body)
			assert.Equal(t, tc.spans, tr.encode.Load())
		})
	}
}
