package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// SpanEncode is the span of one encoder leg (a child of the request's).
const SpanEncode = "encode"

// HeaderEncoders names the encoder engines of llm-d's encoder stage
// (host:port, comma separated, or several header values). Client
// controllable: stripped from every leg.
const HeaderEncoders = "x-encoder-hosts-ports"

// What to do when an encoder leg fails (--on-encoder-failure).
const (
	// EncoderFailError answers the request 502 (as llm-d).
	EncoderFailError = "error"
	// EncoderFailLocal sends the request on without the failed items'
	// encoder output: the prefill/decode engine encodes them itself.
	EncoderFailLocal = "local"
)

// EncoderConfig is the encoder stage (llm-d's E/PD and E/P/D).
type EncoderConfig struct {
	// Connector is connectors.ECExample or connectors.ECNixl; "" turns the
	// stage off (x-encoder-hosts-ports is then only stripped).
	Connector string
	// Timeout bounds the whole fan-out of one request.
	Timeout time.Duration
	// MaxConcurrency bounds the encoder legs of one request in flight at
	// once.
	MaxConcurrency int
	// OnFailure is EncoderFailError or EncoderFailLocal.
	OnFailure string
	// TLS speaks TLS to the encoders (--enable-tls=encoder);
	// InsecureSkipVerify skips their certificate check.
	TLS, InsecureSkipVerify bool
	// MaxEncoders bounds the encoder connection pools kept.
	MaxEncoders int
}

// DefaultEncoderConfig returns the stage's defaults (off).
func DefaultEncoderConfig() EncoderConfig {
	return EncoderConfig{Timeout: 30 * time.Second, MaxConcurrency: 8, OnFailure: EncoderFailError, MaxEncoders: 64}
}

// Validate reports the first invalid setting, as one line.
func (c EncoderConfig) Validate() error {
	switch {
	case c.Connector != "" && c.Connector != connectors.ECExample && c.Connector != connectors.ECNixl:
		return fmt.Errorf("--ec-connector %q is not one of %s, %s", c.Connector, connectors.ECExample, connectors.ECNixl)
	case c.Timeout <= 0:
		return fmt.Errorf("--encoder-timeout must be > 0, got %v", c.Timeout)
	case c.MaxConcurrency <= 0:
		return fmt.Errorf("--encoder-max-concurrency must be > 0, got %d", c.MaxConcurrency)
	case c.OnFailure != EncoderFailError && c.OnFailure != EncoderFailLocal:
		return fmt.Errorf("--on-encoder-failure must be %q or %q, got %q", EncoderFailError, EncoderFailLocal, c.OnFailure)
	case c.MaxEncoders <= 0:
		return fmt.Errorf("max encoders must be > 0, got %d", c.MaxEncoders)
	}
	return nil
}

// Encoder-stage errors. A failed stage's error wraps ErrEncoderFailed,
// answered 502 under --on-encoder-failure error.
var (
	// ErrEncoderFailed: an encoder leg failed, or no encoder was allowed.
	ErrEncoderFailed = errors.New("encoder request failed")
	// ErrEncoderTimeout: the fan-out ran past --encoder-timeout (the
	// stage's error wraps it in ErrEncoderFailed).
	ErrEncoderTimeout = errors.New("--encoder-timeout exceeded")
	// ErrNoEncoder: every encoder named was refused (not host:port, or
	// not on the SSRF allowlist).
	ErrNoEncoder = fmt.Errorf("%w: no encoder of x-encoder-hosts-ports is allowed", ErrEncoderFailed)
)

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
		tc := TLSConfig{Prefiller: true, InsecureSkipVerifyPrefiller: e.InsecureSkipVerify, CAFile: cfg.Guard.TLS.CAFile}
		f, err := tc.Upstream(nil)
		if err != nil {
			return nil, err
		}
		t.UseTLS(f)
	}
	return t, nil
}

// encoders are the encoder addresses of the header values vs, in order:
// entries that are not host:port and those the SSRF allowlist refuses are
// dropped and counted.
func (p *Proxy) encoders(vs [][]byte) (addrs []string, dropped int) {
	m := p.m.Encoder
	for _, v := range vs {
		for _, e := range bytes.Split(v, []byte{','}) {
			hp := string(bytes.TrimSpace(e))
			if hp == "" {
				continue
			}
			host, port, err := net.SplitHostPort(hp)
			if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n <= 0 || n > 65535 {
				m.Failures.WithLabelValues(metrics.EncoderInvalid).Inc()
				dropped++
				continue
			}
			if al := p.cfg.Guard.Allowlist; al != nil && !al.Allowed(hp) {
				m.Failures.WithLabelValues(metrics.EncoderDenied).Inc()
				dropped++
				continue
			}
			addrs = append(addrs, hp)
		}
	}
	return addrs, dropped
}

// encode runs the encoder stage of a request naming encoders: its
// multimodal items go to the encoders in parallel, round robin, one item
// per request; then r.body continues with cache_hit_threshold 0 and (for
// ec-nixl) the encoders' ec_transfer_params merged into its own. A request
// without multimodal items contacts no encoder and is left as it is. A
// failure is the request's error under --on-encoder-failure error; under
// local the failed items are left for the engines to encode themselves.
func (r *request) encode() error {
	p := r.p
	cfg := p.cfg.Encoder
	if cfg.Connector == "" {
		return nil
	}
	vs := r.rc.Request.Header.PeekAll(HeaderEncoders)
	if len(vs) == 0 {
		return nil
	}
	items := connectors.MMItems(r.body)
	if len(items) == 0 {
		r.stageEnded(metrics.StageNoItems)
		r.logAt(zerolog.DebugLevel).Msg("encoders named but no multimodal item: encoder stage skipped")
		return nil
	}
	addrs, dropped := p.encoders(vs)
	if len(addrs) == 0 {
		err := fmt.Errorf("%w (%d refused)", ErrNoEncoder, dropped)
		return r.encoderStageFailed(err, len(items), nil)
	}
	if dropped > 0 {
		r.logAt(zerolog.WarnLevel).Int("refused", dropped).Msg("encoder addresses refused (not host:port or not allowlisted); the others are used")
	}
	params, failed, err := r.fanOut(items, addrs)
	if err != nil {
		return r.encoderStageFailed(err, failed, nil)
	}
	if failed > 0 {
		return r.encoderStageFailed(fmt.Errorf("%w: %d of %d items", ErrEncoderFailed, failed, len(items)), failed, params)
	}
	r.stageEnded(metrics.StageEncoded)
	return r.continueEncoded(params)
}

// encoderStageFailed ends a failed stage: err under --on-encoder-failure
// error; under local, the request continues with what the successful
// legs gave (params), the failed items (failed) left to the engines.
func (r *request) encoderStageFailed(err error, failed int, params [][]byte) error {
	if r.gone() {
		return ErrClientGone
	}
	if r.p.cfg.Encoder.OnFailure != EncoderFailLocal {
		r.stageEnded(metrics.StageFailed)
		return err
	}
	r.stageEnded(metrics.StageDegraded)
	r.logAt(zerolog.WarnLevel).Err(err).Int("items_left_to_engine", failed).Msg("encoder stage degraded: the engine encodes the failed items itself")
	return r.continueEncoded(params)
}

// stageEnded counts the encoder stage's outcome and tells the request's
// report (the status view).
func (r *request) stageEnded(outcome string) {
	r.p.m.Encoder.Stages.WithLabelValues(outcome).Inc()
	r.obs.encoder = outcome
}

// continueEncoded sets r.body to the body past the stage.
func (r *request) continueEncoded(params [][]byte) error {
	var ec []byte
	if r.p.cfg.Encoder.Connector == connectors.ECNixl {
		var own []byte
		if v := jsonMember(r.body, "ec_transfer_params"); v != nil {
			own = v
		}
		ec = connectors.MergeECParams(own, params)
		if ec == nil {
			r.logAt(zerolog.WarnLevel).Msg("no encoder answered ec_transfer_params; the field is not added")
		}
	}
	body, err := connectors.ECStageBody(nil, r.body, ec)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	r.body = body
	return nil
}

// fanOut sends each item to addrs[i%len(addrs)], at most
// --encoder-max-concurrency at once, all within --encoder-timeout. It
// returns the ec_transfer_params answered (ec-nixl; in item order, nil
// for items without), how many items failed, and, under
// --on-encoder-failure error, the first failure (which cancels the rest).
func (r *request) fanOut(items []connectors.MMItem, addrs []string) (params [][]byte, failed int, first error) {
	cfg := r.p.cfg.Encoder
	r.logger() // built once here: the legs' goroutines only read it
	ctx, cancel := context.WithTimeoutCause(r.ctx, cfg.Timeout, ErrEncoderTimeout)
	defer cancel()
	failFast := cfg.OnFailure == EncoderFailError
	out := make([][]byte, len(items))
	errs := make([]error, len(items))
	sem := make(chan struct{}, cfg.MaxConcurrency)
	var wg sync.WaitGroup
	var once sync.Once
	for i, it := range items {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			// Never sent: counted as the legs that were.
			if errs[i] = r.encodeErr(ctx, nil); encoderReason(errs[i]) != "" {
				r.p.m.Encoder.Failures.WithLabelValues(encoderReason(errs[i])).Inc()
			}
			continue
		}
		r.p.m.Encoder.Items.Inc()
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i], errs[i] = r.encodeItem(ctx, i, it, addrs[i%len(addrs)])
			if errs[i] != nil && failFast {
				once.Do(cancel)
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err == nil {
			continue
		}
		failed++
		// The first real failure, not a leg it cancelled.
		if first == nil || errors.Is(first, errCancelledByFailure) && !errors.Is(err, errCancelledByFailure) {
			first = fmt.Errorf("%w for item %d: %w", ErrEncoderFailed, i, err)
		}
	}
	if !failFast {
		first = nil
	}
	return out, failed, first
}

// errCancelledByFailure marks a leg cancelled because another one failed
// (--on-encoder-failure error).
var errCancelledByFailure = errors.New("cancelled by another item's failure")

// encodeErr names why ctx ended a leg whose transport error was err.
func (r *request) encodeErr(ctx context.Context, err error) error {
	switch cause := context.Cause(ctx); {
	case r.gone():
		return ErrClientGone
	case errors.Is(cause, ErrEncoderTimeout):
		return ErrEncoderTimeout
	case cause != nil:
		return errCancelledByFailure
	case err != nil && upstream.IsTimeout(err):
		return fmt.Errorf("%w: %w", ErrEncoderTimeout, err)
	case err != nil:
		return err // refused, reset: unreachable
	}
	return context.Cause(ctx)
}

// encodeItem sends item idx to addr and returns its ec_transfer_params
// (ec-nixl; nil when the answer has none). The leg is observed in
// pd_sidecar_encode_duration_seconds and a failure counted by reason.
func (r *request) encodeItem(ctx context.Context, idx int, item connectors.MMItem, addr string) (params []byte, err error) {
	m := r.p.m.Encoder
	start := time.Now()
	sctx, span := r.child(SpanEncode, trace.SpanKindClient) // nil without a tracer
	defer func() {
		if span != nil {
			span.SetAttributes(attribute.Int("pd.encoder.item", idx), attribute.String("pd.encoder", addr))
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		}
		outcome := metrics.EncodeOK
		if err != nil {
			outcome = metrics.EncodeFailed
			if reason := encoderReason(err); reason != "" {
				m.Failures.WithLabelValues(reason).Inc()
			}
			if !errors.Is(err, errCancelledByFailure) && !errors.Is(err, ErrClientGone) {
				r.logAt(zerolog.WarnLevel).Err(err).Int("item", idx).Str("encoder", logValue(addr)).Msg("encoder leg failed")
			}
		}
		m.Duration.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
	}()
	body, err := connectors.EncoderBody(nil, r.body, item)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/v1/chat/completions")
	req.Header.SetHost(addr)
	req.Header.SetContentType("application/json")
	req.Header.Set(HeaderRequestID, connectors.ECRequestID(r.id, idx))
	if span != nil {
		r.p.ext.Propagator.Inject(sctx, headerCarrier{&req.Header})
	}
	req.SetBodyRaw(body)
	hold, err := r.p.encTr.Do(ctx, addr, req, resp)
	if err != nil {
		if ctx.Err() == nil && (errors.Is(err, upstream.ErrBufferBudget) || errors.Is(err, upstream.ErrBadUpstreamAnswer)) {
			err = fmt.Errorf("%w: %w", errEncoderBadAnswer, err)
		} else if err = r.encodeErr(ctx, err); errors.Is(err, ErrClientGone) || errors.Is(err, errCancelledByFailure) {
			return nil, err
		}
		return nil, upstreamErr(upstream.RoleEncoder, addr, err)
	}
	defer hold.Release()
	if s := resp.StatusCode(); s < 200 || s > 299 {
		// Its body is the encoder's to choose: never said.
		return nil, &upstream.UpstreamError{Role: upstream.RoleEncoder, Reason: fmt.Sprintf("answered status %d", s), Addr: addr, Err: errEncoderStatus}
	}
	if r.p.cfg.Encoder.Connector != connectors.ECNixl {
		return nil, nil // ec-example: the encoder wrote the item to the shared cache
	}
	ec, addrs, err := connectors.ECParamsOf(resp.Body())
	if err != nil {
		return nil, &upstream.UpstreamError{Role: upstream.RoleEncoder, Reason: errEncoderBadAnswer.Error(), Addr: addr,
			Err: fmt.Errorf("%w: %w", errEncoderBadAnswer, err)}
	}
	if a, ok := r.p.refusedAddr(addr, addrs); !ok { // answeraddrs.go
		return nil, fmt.Errorf("%w: %s names an address that is neither the encoder's host nor on the allowlist", errEncoderBadAnswer, a.Field)
	}
	if ec == nil {
		r.logAt(zerolog.WarnLevel).Int("item", idx).Msg("encoder answered no ec_transfer_params")
	}
	return append([]byte(nil), ec...), nil
}

var (
	errEncoderStatus    = errors.New("encoder answered status")
	errEncoderBadAnswer = errors.New("unusable encoder answer")
)

// encoderReason is the failure reason label of an encoder leg's error
// ("" for a leg cancelled by another's failure or by the client).
func encoderReason(err error) string {
	switch {
	case errors.Is(err, errCancelledByFailure), errors.Is(err, ErrClientGone):
		return ""
	case errors.Is(err, ErrEncoderTimeout):
		return metrics.EncoderTimeout
	case errors.Is(err, errEncoderStatus):
		return metrics.EncoderStatus
	case errors.Is(err, errEncoderBadAnswer), errors.Is(err, ErrBadRequest):
		return metrics.EncoderBadAnswer
	}
	return metrics.EncoderUnreachable
}

// jsonMember is the raw value of body's top-level member key (nil when
// absent).
func jsonMember(body []byte, key string) []byte {
	v := gjson.GetBytes(body, key)
	if !v.Exists() {
		return nil
	}
	return []byte(v.Raw)
}
