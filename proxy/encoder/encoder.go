// Package encoder runs llm-d's encoder stage (E/PD and E/P/D): before a
// request's prefill, its multimodal items go to the encoder engines its
// x-encoder-hosts-ports header names, in parallel, round robin, one item
// per encoder request; the body then continues with cache_hit_threshold 0
// and, for ec-nixl, the encoders' ec_transfer_params merged into its own.
// The package parses and checks the encoder addresses, sends the legs
// (bounded in number and in time), checks the encoders' answers against
// what the connector documents, merges them into the body, and decides
// what a failure does (--on-encoder-failure). The stage is the admitter
// (proxy/feature) of a request naming encoders (Stage.Admit): a blocking
// step of its admission, which reads the request's header and hands the
// run its logger and spans (Request) and the admission its outcome.
package encoder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// What to do when an encoder leg fails (--on-encoder-failure).
const (
	// FailError answers the request 502 (as llm-d).
	FailError = "error"
	// FailLocal sends the request on without the failed items' encoder
	// output: the prefill/decode engine encodes them itself.
	FailLocal = "local"
)

// Config is the encoder stage (llm-d's E/PD and E/P/D).
type Config struct {
	// Connector is connectors.ECExample or connectors.ECNixl; "" turns the
	// stage off (x-encoder-hosts-ports is then only stripped).
	Connector string
	// Timeout bounds the whole fan-out of one request.
	Timeout time.Duration
	// MaxConcurrency bounds the encoder legs of one request in flight at
	// once.
	MaxConcurrency int
	// OnFailure is FailError or FailLocal.
	OnFailure string
	// TLS speaks TLS to the encoders (--enable-tls=encoder);
	// InsecureSkipVerify skips their certificate check.
	TLS, InsecureSkipVerify bool
	// MaxEncoders bounds the encoder connection pools kept.
	MaxEncoders int
}

// DefaultConfig returns the stage's defaults (off).
func DefaultConfig() Config {
	return Config{Timeout: 30 * time.Second, MaxConcurrency: 8, OnFailure: FailError, MaxEncoders: 64}
}

// Validate reports the first invalid setting, as one line.
func (c Config) Validate() error {
	switch {
	case c.Connector != "" && c.Connector != connectors.ECExample && c.Connector != connectors.ECNixl:
		return fmt.Errorf("--ec-connector %q is not one of %s, %s", c.Connector, connectors.ECExample, connectors.ECNixl)
	case c.Timeout <= 0:
		return fmt.Errorf("--encoder-timeout must be > 0, got %v", c.Timeout)
	case c.MaxConcurrency <= 0:
		return fmt.Errorf("--encoder-max-concurrency must be > 0, got %d", c.MaxConcurrency)
	case c.OnFailure != FailError && c.OnFailure != FailLocal:
		return fmt.Errorf("--on-encoder-failure must be %q or %q, got %q", FailError, FailLocal, c.OnFailure)
	case c.MaxEncoders <= 0:
		return fmt.Errorf("max encoders must be > 0, got %d", c.MaxEncoders)
	}
	return nil
}

// Encoder-stage errors. A failed stage's error wraps ErrFailed, answered
// 502 under --on-encoder-failure error. None of them carries what the
// sidecar answers: that is the caller's to decide, from the errors they
// wrap (a client body no leg can be built of wraps Deps.BadRequest).
var (
	// ErrFailed: an encoder leg failed, or no encoder was allowed.
	ErrFailed = errors.New("encoder request failed")
	// ErrTimeout: the fan-out ran past --encoder-timeout (the stage's
	// error wraps it in ErrFailed).
	ErrTimeout = errors.New("--encoder-timeout exceeded")
	// ErrNoneAllowed: every encoder named was refused (not host:port, or
	// not on the SSRF allowlist).
	ErrNoneAllowed = fmt.Errorf("%w: no encoder of x-encoder-hosts-ports is allowed", ErrFailed)
)

// Deps is what a Stage needs of the sidecar. Every field is required but
// Allowlist.
type Deps struct {
	// Config is the stage's; its Connector is set (the stage is on).
	Config Config
	// Transport sends the encoder legs; their answers are read whole,
	// within its answer limits.
	Transport *upstream.Transport
	// Allowlist admits encoder addresses (--enable-ssrf-protection); nil
	// admits any.
	Allowlist ssrf.Allowlist
	// RefusedAddr returns the first of the addresses an answer of the
	// upstream peer (host:port) names that SSRF protection refuses; ok is
	// true when none is refused.
	RefusedAddr func(peer string, addrs []connectors.Addr) (refused connectors.Addr, ok bool)
	// BadRequest is the error a client body that no leg or continuing
	// body can be built of is wrapped in (the request path's 400).
	BadRequest error
	// Metrics are the stage's collectors.
	Metrics *metrics.Encoder
}

// Request is one request's part in the stage: what it is, and how it logs
// and traces.
type Request struct {
	// ID is the request's id; the leg of item idx carries
	// connectors.ECRequestID(ID, idx).
	ID string
	// Body is the client's body, a JSON object; it is only read.
	Body []byte
	// Encoders are the values of x-encoder-hosts-ports (host:port,
	// comma separated), in order.
	Encoders [][]byte
	// Log is the request's log at a level (nil when that level is off),
	// asked on Run's own goroutine only.
	Log func(zerolog.Level) *zerolog.Event
	// Logger is the request's logger, asked once, on Run's goroutine,
	// before the legs start: they log through it.
	Logger func() *zerolog.Logger
	// Span starts the span of one leg, a child of the request's, and
	// Inject writes its context (ctx) on the leg's head. Nil: no leg is
	// traced.
	Span   func() (context.Context, trace.Span)
	Inject func(ctx context.Context, h *fasthttp.RequestHeader)
}

// Stage is the encoder stage of a proxy. Safe for concurrent use.
type Stage struct {
	d Deps
}

// New returns the stage d describes.
func New(d Deps) *Stage { return &Stage{d: d} }

// run is one request's pass through the stage.
type run struct {
	s   *Stage
	ctx context.Context // the request's
	req Request
	// lg is the request's logger from the fan-out on (nil before).
	lg *zerolog.Logger
}

// Run runs the encoder stage of req and returns the body the request
// continues with and the stage's outcome (metrics.Stage*), counted. A
// request without multimodal items contacts no encoder and continues with
// its body as it is. A failure is the stage's error under
// --on-encoder-failure error; under local the failed items are left for
// the engines to encode themselves. ctx is the request's: once it has
// ended (the client left) a failed stage returns its cause, and no
// outcome.
func (s *Stage) Run(ctx context.Context, req Request) (body []byte, outcome string, err error) {
	rn := &run{s: s, ctx: ctx, req: req}
	items := connectors.MMItems(req.Body)
	if len(items) == 0 {
		outcome = s.ended(metrics.StageNoItems)
		rn.logAt(zerolog.DebugLevel).Msg("encoders named but no multimodal item: encoder stage skipped")
		return req.Body, outcome, nil
	}
	addrs, dropped := s.encoders(req.Encoders)
	if len(addrs) == 0 {
		return rn.failed(fmt.Errorf("%w (%d refused)", ErrNoneAllowed, dropped), len(items), nil)
	}
	if dropped > 0 {
		rn.logAt(zerolog.WarnLevel).Int("refused", dropped).Msg("encoder addresses refused (not host:port or not allowlisted); the others are used")
	}
	params, failed, err := rn.fanOut(items, addrs)
	if err != nil {
		return rn.failed(err, failed, nil)
	}
	if failed > 0 {
		return rn.failed(fmt.Errorf("%w: %d of %d items", ErrFailed, failed, len(items)), failed, params)
	}
	outcome = s.ended(metrics.StageEncoded)
	body, err = rn.continued(params)
	return body, outcome, err
}

// ended counts the stage's outcome and returns it.
func (s *Stage) ended(outcome string) string {
	s.d.Metrics.Stages.WithLabelValues(outcome).Inc()
	return outcome
}

// logAt is the request's log at level l (nil when l is off): through its
// logger once the fan-out has asked for it, else through Request.Log.
func (rn *run) logAt(l zerolog.Level) *zerolog.Event {
	if rn.lg != nil {
		return rn.lg.WithLevel(l)
	}
	return rn.req.Log(l)
}

// failed ends a failed stage: err under --on-encoder-failure error; under
// local, the request continues with what the successful legs gave
// (params), the failed items (failed) left to the engines.
func (rn *run) failed(err error, failed int, params [][]byte) ([]byte, string, error) {
	if rn.ctx.Err() != nil {
		return nil, "", context.Cause(rn.ctx)
	}
	if rn.s.d.Config.OnFailure != FailLocal {
		return nil, rn.s.ended(metrics.StageFailed), err
	}
	outcome := rn.s.ended(metrics.StageDegraded)
	rn.logAt(zerolog.WarnLevel).Err(err).Int("items_left_to_engine", failed).Msg("encoder stage degraded: the engine encodes the failed items itself")
	body, err := rn.continued(params)
	return body, outcome, err
}

// continued is the request's body past the stage.
func (rn *run) continued(params [][]byte) ([]byte, error) {
	var ec []byte
	if rn.s.d.Config.Connector == connectors.ECNixl {
		var own []byte
		if v := jsonMember(rn.req.Body, "ec_transfer_params"); v != nil {
			own = v
		}
		ec = connectors.MergeECParams(own, params)
		if ec == nil {
			rn.logAt(zerolog.WarnLevel).Msg("no encoder answered ec_transfer_params; the field is not added")
		}
	}
	body, err := connectors.ECStageBody(nil, rn.req.Body, ec)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", rn.s.d.BadRequest, err)
	}
	return body, nil
}

// encoders are the encoder addresses of the header values vs, in order:
// entries that are not host:port and those the SSRF allowlist refuses are
// dropped and counted.
func (s *Stage) encoders(vs [][]byte) (addrs []string, dropped int) {
	m := s.d.Metrics
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
			if al := s.d.Allowlist; al != nil && !al.Allowed(hp) {
				m.Failures.WithLabelValues(metrics.EncoderDenied).Inc()
				dropped++
				continue
			}
			addrs = append(addrs, hp)
		}
	}
	return addrs, dropped
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
