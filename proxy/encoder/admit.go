package encoder

import (
	"bytes"
	"context"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// Header names the encoder engines of a request (host:port, comma
// separated, or several header values). Client controllable: stripped
// from every leg.
const Header = "x-encoder-hosts-ports"

// LegSpan is the span of one encoder leg (a child of the request's).
const LegSpan = "encode"

// Admit is the stage's part in the admission of a request whose Header
// names encoders: a blocking step (nil: none named) that runs the stage
// (Run) on a copy of a's body, after which a's body is the one the stage
// leaves and a.Encoded its outcome. A failure refuses the request under
// --on-encoder-failure error (a.Refusal); under local the request
// continues.
func (s *Stage) Admit(a *feature.Admission, h feature.Head) (feature.Step, error) {
	peeked := h.PeekAll(Header)
	if len(peeked) == 0 {
		return nil, nil
	}
	vs := make([][]byte, len(peeked)) // the head may be read again before the step ends
	for i, v := range peeked {
		vs[i] = append([]byte(nil), v...)
	}
	log, tr := a.Log, a.Trace
	lg := log.Logger() // built here, on the request's goroutine: the stage logs with it
	req := Request{
		ID: a.ID, Body: bytes.Clone(a.Body), Encoders: vs,
		Log: log.LogAt, Logger: func() *zerolog.Logger { return lg },
	}
	if tr != nil {
		req.Span = func() (context.Context, trace.Span) { return tr.Child(LegSpan, trace.SpanKindClient) }
		req.Inject = func(ctx context.Context, h *fasthttp.RequestHeader) { tr.InjectSpan(ctx, h) }
	}
	return func(ctx context.Context) func() {
		body, outcome, err := s.Run(ctx, req)
		return func() {
			if outcome != "" {
				a.Encoded = outcome // the status view's
			}
			if err != nil {
				a.Refusal = err
				return
			}
			a.Body = body
		}
	}, nil
}
