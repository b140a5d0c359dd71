package encoder

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/logvalue"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// headerRequestID is the header of a leg's request id, as on every leg
// the sidecar sends (core.HeaderRequestID).
const headerRequestID = "X-Request-Id"

// fanOut sends each item to addrs[i%len(addrs)], at most
// --encoder-max-concurrency at once, all within --encoder-timeout. It
// returns the ec_transfer_params answered (ec-nixl; in item order, nil
// for items without), how many items failed, and, under
// --on-encoder-failure error, the first failure (which cancels the rest).
func (rn *run) fanOut(items []connectors.MMItem, addrs []string) (params [][]byte, failed int, first error) {
	cfg := rn.s.d.Config
	m := rn.s.d.Metrics
	rn.lg = rn.req.Logger() // asked once here: the legs' goroutines only read it
	ctx, cancel := context.WithTimeoutCause(rn.ctx, cfg.Timeout, ErrTimeout)
	defer cancel()
	failFast := cfg.OnFailure == FailError
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
			if errs[i] = rn.legEnd(ctx, nil); rn.s.reason(errs[i]) != "" {
				m.Failures.WithLabelValues(rn.s.reason(errs[i])).Inc()
			}
			continue
		}
		m.Items.Inc()
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i], errs[i] = rn.encodeItem(ctx, i, it, addrs[i%len(addrs)])
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
			first = fmt.Errorf("%w for item %d: %w", ErrFailed, i, err)
		}
	}
	if !failFast {
		first = nil
	}
	return out, failed, first
}

var (
	// errCancelledByFailure marks a leg cancelled because another one
	// failed (--on-encoder-failure error).
	errCancelledByFailure = errors.New("cancelled by another item's failure")
	// errGone marks a leg ended by the end of the request's context (the
	// client left); the stage then ends with that context's cause.
	errGone = errors.New("the request ended")
)

// legEnd names why ctx ended a leg whose transport error was err.
func (rn *run) legEnd(ctx context.Context, err error) error {
	switch cause := context.Cause(ctx); {
	case rn.ctx.Err() != nil:
		return errGone
	case errors.Is(cause, ErrTimeout):
		return ErrTimeout
	case cause != nil:
		return errCancelledByFailure
	case err != nil && upstream.IsTimeout(err):
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	case err != nil:
		return err // refused, reset: unreachable
	}
	return context.Cause(ctx)
}

// encodeItem sends item idx to addr and returns its ec_transfer_params
// (ec-nixl; nil when the answer has none). The leg is observed in
// pd_sidecar_encode_duration_seconds and a failure counted by reason.
func (rn *run) encodeItem(ctx context.Context, idx int, item connectors.MMItem, addr string) (params []byte, err error) {
	d := &rn.s.d
	m := d.Metrics
	start := time.Now()
	var sctx context.Context
	var span trace.Span // nil without a tracer
	if rn.req.Span != nil {
		sctx, span = rn.req.Span()
	}
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
			if reason := rn.s.reason(err); reason != "" {
				m.Failures.WithLabelValues(reason).Inc()
			}
			if !errors.Is(err, errCancelledByFailure) && !errors.Is(err, errGone) {
				rn.logAt(zerolog.WarnLevel).Err(err).Int("item", idx).Str("encoder", logvalue.Cut(addr)).Msg("encoder leg failed")
			}
		}
		m.Duration.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
	}()
	body, err := connectors.EncoderBody(nil, rn.req.Body, item)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", d.BadRequest, err)
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/v1/chat/completions")
	req.Header.SetHost(addr)
	req.Header.SetContentType("application/json")
	req.Header.Set(headerRequestID, connectors.ECRequestID(rn.req.ID, idx))
	if span != nil {
		rn.req.Inject(sctx, &req.Header)
	}
	req.SetBodyRaw(body)
	hold, err := d.Transport.Do(ctx, addr, req, resp)
	if err != nil {
		if ctx.Err() == nil && (errors.Is(err, upstream.ErrBufferBudget) || errors.Is(err, upstream.ErrBadUpstreamAnswer)) {
			err = fmt.Errorf("%w: %w", errEncoderBadAnswer, err)
		} else if err = rn.legEnd(ctx, err); errors.Is(err, errGone) || errors.Is(err, errCancelledByFailure) {
			return nil, err
		}
		return nil, legError(addr, err)
	}
	defer hold.Release()
	if s := resp.StatusCode(); s < 200 || s > 299 {
		// Its body is the encoder's to choose: never said.
		return nil, &upstream.UpstreamError{Role: upstream.RoleEncoder, Reason: fmt.Sprintf("answered status %d", s), Addr: addr, Err: errEncoderStatus}
	}
	if d.Config.Connector != connectors.ECNixl {
		return nil, nil // ec-example: the encoder wrote the item to the shared cache
	}
	ec, addrs, err := connectors.ECParamsOf(resp.Body())
	if err != nil {
		return nil, &upstream.UpstreamError{Role: upstream.RoleEncoder, Reason: errEncoderBadAnswer.Error(), Addr: addr,
			Err: fmt.Errorf("%w: %w", errEncoderBadAnswer, err)}
	}
	if a, ok := d.RefusedAddr(addr, addrs); !ok {
		return nil, fmt.Errorf("%w: %s names an address that is neither the encoder's host nor on the allowlist", errEncoderBadAnswer, a.Field)
	}
	if ec == nil {
		rn.logAt(zerolog.WarnLevel).Int("item", idx).Msg("encoder answered no ec_transfer_params")
	}
	return append([]byte(nil), ec...), nil
}

var (
	errEncoderStatus    = errors.New("encoder answered status")
	errEncoderBadAnswer = errors.New("unusable encoder answer")
)

// reason is the failure reason label of an encoder leg's error ("" for a
// leg cancelled by another's failure or by the request's end).
func (s *Stage) reason(err error) string {
	switch {
	case errors.Is(err, errCancelledByFailure), errors.Is(err, errGone):
		return ""
	case errors.Is(err, ErrTimeout):
		return metrics.EncoderTimeout
	case errors.Is(err, errEncoderStatus):
		return metrics.EncoderStatus
	case errors.Is(err, errEncoderBadAnswer), errors.Is(err, s.d.BadRequest):
		return metrics.EncoderBadAnswer
	}
	return metrics.EncoderUnreachable
}

// legError returns err, a failed exchange with the encoder at addr (the
// upstream.LegError's address in err when it has one), as an
// upstream.UpstreamError; an err that already holds one is returned as it
// is. Its reason is upstream.ReasonOf's, but for the stage's timeout.
func legError(addr string, err error) error {
	var ue *upstream.UpstreamError
	if errors.As(err, &ue) {
		return err
	}
	var le *upstream.LegError
	if errors.As(err, &le) {
		addr = le.Addr
	}
	reason := upstream.ReasonOf(err)
	if errors.Is(err, ErrTimeout) && !errors.Is(err, upstream.ErrBadUpstreamAnswer) && !errors.Is(err, upstream.ErrBufferBudget) {
		reason = "timed out"
	}
	return &upstream.UpstreamError{Role: upstream.RoleEncoder, Reason: reason, Addr: addr, Err: err}
}
