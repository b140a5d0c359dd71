package inference

import (
	"context"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/tlsconf"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// SpanEncode is the span of one encoder leg (a child of the request's).
const SpanEncode = "encode"

// HeaderEncoders names the encoder engines of llm-d's encoder stage
// (host:port, comma separated, or several header values). Client
// controllable: stripped from every leg.
const HeaderEncoders = "x-encoder-hosts-ports"

// newEncoderTransport is the encoder legs' transport, with TLS when the
// stage asks for it; nil when the stage is off.
func newEncoderTransport(cfg Config) (*upstream.Transport, error) {
	e := cfg.Encoder
	if e.Connector == "" {
		return nil, nil
	}
	t := upstream.NewTransport(cfg.ConnectTimeout, cfg.MaxConnsPerHost, e.MaxEncoders)
	t.SetAnswerLimits(cfg.MaxUpstreamAnswerBytes, cfg.Guard.MaxHeaderBytes)
	if e.TLS {
		// Every encoder address gets the "prefiller" config of this one.
		tc := tlsconf.Config{Prefiller: true, InsecureSkipVerifyPrefiller: e.InsecureSkipVerify, CAFile: cfg.Guard.TLS.CAFile}
		f, err := tc.Upstream(nil)
		if err != nil {
			return nil, err
		}
		t.UseTLS(f)
	}
	return t, nil
}

// newEncoderStage returns the encoder stage of p, through its encoder
// transport, with its SSRF checks; nil when the stage is off.
func newEncoderStage(p *Proxy) *encoder.Stage {
	if p.EncTr == nil {
		return nil
	}
	return encoder.New(encoder.Deps{
		Config:      p.Cfg.Encoder,
		Transport:   p.EncTr,
		Allowlist:   p.Cfg.Guard.Allowlist,
		RefusedAddr: p.refusedAddr,
		Inject: func(ctx context.Context, h *fasthttp.RequestHeader) {
			p.Trace.Inject(ctx, h) // set by SetExtras, after New
		},
		BadRequest: ErrBadRequest,
		Metrics:    p.M.Encoder,
	})
}

// encoderStage is the admitter that runs the encoder stage (encodeStep).
type encoderStage struct{}

func (encoderStage) admit(r *Request, h *fasthttp.RequestHeader) (feature.Step, error) {
	return encodeStep(r, h), nil
}

// encodeStep is the encoder stage (encoder.Stage) of a request naming
// encoders, a blocking step (nil: none named, or the stage is off): r.Body
// continues as the stage leaves it, and the request's report says the
// stage's outcome. A failure is the request's error under
// --on-encoder-failure error (Admit answers it); under local the request
// continues.
func encodeStep(r *Request, h *fasthttp.RequestHeader) feature.Step {
	if r.P.enc == nil {
		return nil
	}
	peeked := h.PeekAll(HeaderEncoders)
	if len(peeked) == 0 {
		return nil
	}
	vs := make([][]byte, len(peeked)) // the head may be read again before the step ends
	for i, v := range peeked {
		vs[i] = append([]byte(nil), v...)
	}
	r.Logger() // built here: the stage logs with it
	return func(ctx context.Context) func() {
		body, outcome, err := r.P.enc.Run(ctx, encoder.Request{
			ID: r.ID, Body: r.Body, Encoders: vs,
			Log: r.LogAt, Logger: r.Logger, Span: func() (context.Context, trace.Span) { return encoderSpan(r) },
		})
		return func() {
			if outcome != "" {
				r.Obs.Encoder = outcome // the status view's
			}
			if err != nil {
				r.admitErr = err
				return
			}
			r.Body = body
		}
	}
}

// encoderSpan starts the span of one of r's encoder legs (nil, nil
// without a tracer).
func encoderSpan(r *Request) (context.Context, trace.Span) {
	return r.Obs.Child(SpanEncode, trace.SpanKindClient)
}
