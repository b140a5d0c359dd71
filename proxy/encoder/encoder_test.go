package encoder

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// errBadRequest stands for the request path's 400 (Deps.BadRequest).
var errBadRequest = errors.New("request body is not a JSON object")

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"defaults", func(*Config) {}, ""},
		{"ec-nixl", func(c *Config) { c.Connector = connectors.ECNixl }, ""},
		{"unknown connector", func(c *Config) { c.Connector = "ec-x" }, "--ec-connector"},
		{"timeout", func(c *Config) { c.Timeout = 0 }, "--encoder-timeout"},
		{"concurrency", func(c *Config) { c.MaxConcurrency = 0 }, "--encoder-max-concurrency"},
		{"failure policy", func(c *Config) { c.OnFailure = "retry" }, "--on-encoder-failure"},
		{"max encoders", func(c *Config) { c.MaxEncoders = 0 }, "max encoders"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// TestReason: every encoder-leg error maps to one reason label of the
// closed set, and a leg cancelled by another's failure or by the
// request's end to none.
func TestReason(t *testing.T) {
	s := testStage(t, func(*Deps) {})
	for _, tc := range []struct {
		err    error
		reason string
	}{
		{ErrTimeout, metrics.EncoderTimeout},
		{fmt.Errorf("%w 500: x", errEncoderStatus), metrics.EncoderStatus},
		{fmt.Errorf("%w: x", errEncoderBadAnswer), metrics.EncoderBadAnswer},
		{fmt.Errorf("%w: %w", errBadRequest, connectors.ErrBadBody), metrics.EncoderBadAnswer},
		{&upstream.LegError{Addr: "a:1", Op: "dial", Err: context.Canceled}, metrics.EncoderUnreachable},
		{errCancelledByFailure, ""},
		{errGone, ""},
	} {
		assert.Equal(t, tc.reason, s.reason(tc.err), "%v", tc.err)
	}
}

// fakeEncoder is an in-process encoder: it answers each request with
// ec_transfer_params {"<url>": {"metadata": {"by": "enc_<name>"}}, "by": ...} after delay, or status when set,
// and records the items it got and the legs in flight at most.
type fakeEncoder struct {
	name   string
	status int
	delay  time.Duration
	// hold, when set, keeps each answer back until it is closed (an
	// encoder slower than any timeout under test).
	hold <-chan struct{}

	// legs counts the legs in flight over every fakeEncoder sharing it.
	legs *legGauge

	mu    sync.Mutex
	items []string
	ids   []string
}

type legGauge struct {
	mu      sync.Mutex
	n, peak int
	// together, when > 0, has each leg wait (up to 10 s) until that many
	// were in flight at once: the overlap is an event the legs wait on,
	// not the luck of their timing.
	together int
	reached  chan struct{}
}

func (g *legGauge) add(d int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n += d
	g.peak = max(g.peak, g.n)
	if g.together > 0 && g.peak >= g.together && g.reached != nil {
		select {
		case <-g.reached:
		default:
			close(g.reached)
		}
	}
}

// awaitTogether waits until together legs were in flight at once, or 10 s
// (an implementation that never overlaps them fails the test's count).
func (g *legGauge) awaitTogether() {
	if g.together == 0 {
		return
	}
	select {
	case <-g.reached:
	case <-time.After(10 * time.Second):
	}
}

func (f *fakeEncoder) serve(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) {
		url := gjson.GetBytes(rc.PostBody(), "messages.0.content.0.image_url.url").String()
		f.mu.Lock()
		f.items = append(f.items, url)
		f.ids = append(f.ids, string(rc.Request.Header.Peek("X-Request-Id")))
		f.mu.Unlock()
		if f.legs != nil {
			f.legs.add(1)
			defer f.legs.add(-1)
			f.legs.awaitTogether()
		}
		if f.hold != nil {
			<-f.hold
		}
		time.Sleep(f.delay)
		if f.status != 0 {
			rc.SetStatusCode(f.status)
			return
		}
		rc.SetContentType("application/json")
		fmt.Fprintf(rc, `{"id":"x","ec_transfer_params":{%q:{"metadata":{"by":%q}},"by":{"metadata":{"by":%q}}}}`, url, "enc_"+f.name, "enc_"+f.name)
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// testStage is an ec-nixl stage with the default bounds, as edit leaves
// it, its every address allowed.
func testStage(t *testing.T, edit func(*Deps)) *Stage {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Connector = connectors.ECNixl
	tr := upstream.NewTransport(time.Second, 64, cfg.MaxEncoders)
	t.Cleanup(tr.Close)
	d := Deps{
		Config:      cfg,
		Transport:   tr,
		RefusedAddr: func(string, []connectors.Addr) (connectors.Addr, bool) { return connectors.Addr{}, true },
		BadRequest:  errBadRequest,
		Metrics:     metrics.NewEncoder(prometheus.NewRegistry()),
	}
	edit(&d)
	require.NoError(t, d.Config.Validate())
	return New(d)
}

// chatBody is a chat request with n distinct images and one duplicate.
func chatBody(n int) []byte {
	parts := make([]string, 0, n+1)
	for i := range n {
		parts = append(parts, fmt.Sprintf(`{"type":"image_url","image_url":{"url":"u%d"}}`, i))
	}
	parts = append(parts, `{"type":"image_url","image_url":{"url":"u0"}}`)
	return []byte(`{"model":"m","ec_transfer_params":{"own":1},"messages":[{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`)
}

// runStage runs s on a chat request with n distinct images (and one
// duplicate) naming encoders, under ctx; it returns the body after the
// stage, its outcome and its error.
func runStage(ctx context.Context, s *Stage, encoders string, n int) ([]byte, string, error) {
	lg := zerolog.Nop()
	return s.Run(ctx, Request{
		ID: "rid", Body: chatBody(n), Encoders: [][]byte{[]byte(encoders)},
		Log:    func(l zerolog.Level) *zerolog.Event { return lg.WithLevel(l) },
		Logger: func() *zerolog.Logger { return &lg },
	})
}

// TestFanOutRoundRobinAndMerge: item i goes to encoder i mod n, at most
// --encoder-max-concurrency at once, and the answers' ec_transfer_params
// are merged, in item order (a later key wins), into the request's own.
func TestFanOutRoundRobinAndMerge(t *testing.T) {
	legs := &legGauge{together: 2, reached: make(chan struct{})}
	a := &fakeEncoder{name: "a", delay: 20 * time.Millisecond, legs: legs}
	b := &fakeEncoder{name: "b", delay: 20 * time.Millisecond, legs: legs}
	s := testStage(t, func(d *Deps) { d.Config.MaxConcurrency = 2 })
	body, outcome, err := runStage(context.Background(), s, a.serve(t)+" , "+b.serve(t), 5)
	require.NoError(t, err)
	assert.Equal(t, metrics.StageEncoded, outcome)
	assert.ElementsMatch(t, []string{"u0", "u2", "u4"}, a.items)
	assert.ElementsMatch(t, []string{"u1", "u3"}, b.items)
	assert.ElementsMatch(t, []string{"rid-enc-0", "rid-enc-2", "rid-enc-4"}, a.ids)
	assert.Equal(t, 2, legs.peak, "at most two legs at once")
	h := func(n string) string { return `{"metadata":{"by":"enc_` + n + `"}}` }
	assert.JSONEq(t, `{"own":1,"u0":`+h("a")+`,"by":`+h("a")+`,"u1":`+h("b")+`,"u2":`+h("a")+`,"u3":`+h("b")+`,"u4":`+h("a")+`}`,
		gjson.GetBytes(body, "ec_transfer_params").Raw)
	assert.Equal(t, "0", gjson.GetBytes(body, "cache_hit_threshold").Raw)
	assert.Equal(t, `"own","u0","by","u1","u2","u3","u4"`,
		strings.Trim(gjson.GetBytes(body, "ec_transfer_params|@keys").Raw, "[]"), "keys in first-seen order")
	m := s.d.Metrics
	assert.Equal(t, 5.0, testutil.ToFloat64(m.Items))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Stages.WithLabelValues(metrics.StageEncoded)))
}

// TestFanOutFailure: under error the first failure is the stage's error
// and nothing is merged; under local the request continues with the
// successful legs' params only.
func TestFanOutFailure(t *testing.T) {
	ok, bad := &fakeEncoder{name: "ok"}, &fakeEncoder{name: "bad", status: 500}
	okAddr, badAddr := ok.serve(t), bad.serve(t)

	s := testStage(t, func(*Deps) {})
	_, outcome, err := runStage(context.Background(), s, okAddr+","+badAddr, 2)
	require.ErrorIs(t, err, ErrFailed)
	assert.Equal(t, "encoder request failed for item 1: encoder: answered status 500", err.Error(), "the encoder's body is never said")
	assert.Equal(t, metrics.StageFailed, outcome)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.d.Metrics.Failures.WithLabelValues(metrics.EncoderStatus)))

	s = testStage(t, func(d *Deps) { d.Config.OnFailure = FailLocal })
	body, outcome, err := runStage(context.Background(), s, okAddr+","+badAddr, 2)
	require.NoError(t, err)
	assert.Equal(t, metrics.StageDegraded, outcome)
	assert.JSONEq(t, `{"own":1,"u0":{"metadata":{"by":"enc_ok"}},"by":{"metadata":{"by":"enc_ok"}}}`, gjson.GetBytes(body, "ec_transfer_params").Raw, "item 1 left to the engine")

	// An encoder that answers only once the test ends: the stage ends by
	// the 50 ms timeout (never before it; the upper bound has headroom for
	// any machine).
	release := make(chan struct{})
	slow := &fakeEncoder{name: "slow", hold: release}
	slowAddr := slow.serve(t)
	t.Cleanup(func() { close(release) }) // before the server's shutdown
	const timeout = 50 * time.Millisecond
	s = testStage(t, func(d *Deps) { d.Config.Timeout = timeout })
	start := time.Now()
	_, _, err = runStage(context.Background(), s, slowAddr, 1)
	took := time.Since(start)
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorIs(t, err, ErrFailed)
	assert.Equal(t, "encoder request failed for item 0: encoder: timed out", err.Error())
	assert.GreaterOrEqual(t, took, timeout)
	assert.Less(t, took, timeout+10*time.Second)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.d.Metrics.Failures.WithLabelValues(metrics.EncoderTimeout)))
}

// TestRequestEnded: a request whose context ends during the fan-out (its
// client left) ends the stage with that context's cause, no outcome, and
// no failure counted.
func TestRequestEnded(t *testing.T) {
	release := make(chan struct{})
	slow := &fakeEncoder{name: "slow", hold: release}
	slowAddr := slow.serve(t)
	t.Cleanup(func() { close(release) })
	gone := errors.New("client disconnected")
	for _, policy := range []string{FailError, FailLocal} {
		t.Run(policy, func(t *testing.T) {
			s := testStage(t, func(d *Deps) { d.Config.OnFailure = policy })
			ctx, cancel := context.WithCancelCause(context.Background())
			time.AfterFunc(50*time.Millisecond, func() { cancel(gone) })
			_, outcome, err := runStage(ctx, s, slowAddr, 1)
			assert.Same(t, gone, err)
			assert.Empty(t, outcome)
			m := s.d.Metrics
			for _, o := range []string{metrics.StageEncoded, metrics.StageDegraded, metrics.StageFailed, metrics.StageNoItems} {
				assert.Zero(t, testutil.ToFloat64(m.Stages.WithLabelValues(o)), o)
			}
			for _, r := range []string{metrics.EncoderUnreachable, metrics.EncoderTimeout, metrics.EncoderStatus, metrics.EncoderBadAnswer} {
				assert.Zero(t, testutil.ToFloat64(m.Failures.WithLabelValues(r)), r)
			}
		})
	}
}

// TestAddresses: entries that are not host:port and those the allowlist
// refuses are dropped and counted; when none is left the stage fails with
// ErrNoneAllowed, contacting nothing, or under local continues as if every
// item had failed.
func TestAddresses(t *testing.T) {
	allow := allowOnly("10.0.0.1:8000")
	s := testStage(t, func(d *Deps) { d.Allowlist = allow })
	addrs, dropped := s.encoders([][]byte{[]byte(" 10.0.0.1:8000 ,nohost,, :1,h:0"), []byte("10.0.0.2:8000,h:65536")})
	assert.Equal(t, []string{"10.0.0.1:8000"}, addrs)
	assert.Equal(t, 5, dropped)
	m := s.d.Metrics
	assert.Equal(t, 4.0, testutil.ToFloat64(m.Failures.WithLabelValues(metrics.EncoderInvalid)))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Failures.WithLabelValues(metrics.EncoderDenied)))

	s = testStage(t, func(*Deps) {})
	_, outcome, err := runStage(context.Background(), s, "nohost", 2)
	require.ErrorIs(t, err, ErrNoneAllowed)
	require.ErrorIs(t, err, ErrFailed)
	assert.Equal(t, "encoder request failed: no encoder of x-encoder-hosts-ports is allowed (1 refused)", err.Error())
	assert.Equal(t, metrics.StageFailed, outcome)

	s = testStage(t, func(d *Deps) { d.Config.OnFailure = FailLocal })
	body, outcome, err := runStage(context.Background(), s, "nohost", 2)
	require.NoError(t, err)
	assert.Equal(t, metrics.StageDegraded, outcome)
	assert.JSONEq(t, `{"own":1}`, gjson.GetBytes(body, "ec_transfer_params").Raw)
	assert.Equal(t, "0", gjson.GetBytes(body, "cache_hit_threshold").Raw)
}

// TestNoItems: a request without multimodal items contacts no encoder and
// continues with its body as it is.
func TestNoItems(t *testing.T) {
	s := testStage(t, func(*Deps) {})
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	lg := zerolog.Nop()
	got, outcome, err := s.Run(context.Background(), Request{
		ID: "rid", Body: body, Encoders: [][]byte{[]byte("127.0.0.1:1")},
		Log:    func(l zerolog.Level) *zerolog.Event { return lg.WithLevel(l) },
		Logger: func() *zerolog.Logger { t.Error("no leg, no logger asked"); return &lg },
	})
	require.NoError(t, err)
	assert.Equal(t, metrics.StageNoItems, outcome)
	assert.Equal(t, string(body), string(got))
	assert.Zero(t, testutil.ToFloat64(s.d.Metrics.Items))
}

// TestAnswerChecks: an ec-nixl encoder's answer that is not a JSON object,
// or names an address SSRF protection refuses, fails its leg
// (bad_answer); an ec-example encoder's answer is not read.
func TestAnswerChecks(t *testing.T) {
	ok := &fakeEncoder{name: "ok"}
	okAddr := ok.serve(t)
	refusing := func(d *Deps) {
		d.RefusedAddr = func(peer string, addrs []connectors.Addr) (connectors.Addr, bool) {
			assert.Equal(t, okAddr, peer)
			return connectors.Addr{Field: "ec_transfer_params.u0.host"}, false
		}
	}
	s := testStage(t, refusing)
	_, _, err := runStage(context.Background(), s, okAddr, 1)
	require.ErrorIs(t, err, errEncoderBadAnswer)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.d.Metrics.Failures.WithLabelValues(metrics.EncoderBadAnswer)))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) { rc.SetBodyString("[1]") }}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	s = testStage(t, func(*Deps) {})
	_, _, err = runStage(context.Background(), s, ln.Addr().String(), 1)
	require.ErrorIs(t, err, errEncoderBadAnswer)
	var ue *upstream.UpstreamError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, ln.Addr().String(), ue.Addr)
	assert.Equal(t, "encoder request failed for item 0: encoder: unusable encoder answer", err.Error())

	// ec-example: the answer is not read.
	s = testStage(t, func(d *Deps) { d.Config.Connector = connectors.ECExample; refusing(d) })
	body, _, err := runStage(context.Background(), s, okAddr, 1)
	require.NoError(t, err)
	assert.JSONEq(t, `{"own":1}`, gjson.GetBytes(body, "ec_transfer_params").Raw)
}

// allowOnly is an allowlist of the addresses given.
type allowOnly string

func (a allowOnly) Allowed(hp string) bool { return hp == string(a) }
