package proxy

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// TestScanRequestEncoders: x-encoder-hosts-ports (as long as
// x-prefiller-host-port) is seen in any letter case, without taking the
// prefiller's place, and a leg's head never carries it.
func TestScanRequestEncoders(t *testing.T) {
	for _, tc := range []struct {
		name, headers string
		encoders      bool
		prefiller     string
	}{
		{"none", "Content-Type: application/json\r\n", false, ""},
		{"encoders, any case", "X-Encoder-HOSTS-Ports: 10.0.0.1:8000\r\n", true, ""},
		{"encoders and prefiller", "x-encoder-hosts-ports: e:1\r\nx-prefiller-host-port: p:2\r\n", true, "p:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := parseRequestHead(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+tc.headers+"Content-Length: 2\r\n\r\n")
			lr := scanRequest(h)
			assert.Equal(t, tc.encoders, lr.encoders)
			assert.False(t, lr.refused, "refused only while the stage is on (the caller's check)")
			assert.Equal(t, tc.prefiller, string(lr.prefiller))
			assert.NotContains(t, strings.ToLower(string(appendLegHead(nil, h, "127.0.0.1:1", "rid", 2))), HeaderEncoders)
		})
	}
}

func TestEncoderConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*EncoderConfig)
		want string
	}{
		{"defaults", func(*EncoderConfig) {}, ""},
		{"ec-nixl", func(c *EncoderConfig) { c.Connector = connectors.ECNixl }, ""},
		{"unknown connector", func(c *EncoderConfig) { c.Connector = "ec-x" }, "--ec-connector"},
		{"timeout", func(c *EncoderConfig) { c.Timeout = 0 }, "--encoder-timeout"},
		{"concurrency", func(c *EncoderConfig) { c.MaxConcurrency = 0 }, "--encoder-max-concurrency"},
		{"failure policy", func(c *EncoderConfig) { c.OnFailure = "retry" }, "--on-encoder-failure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultEncoderConfig()
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

// TestEncoderReason: every encoder-leg error maps to one reason label of
// the closed set, and a leg cancelled by another's failure to none; every
// stage failure is answered 502.
func TestEncoderReason(t *testing.T) {
	for _, tc := range []struct {
		err    error
		reason string
	}{
		{ErrEncoderTimeout, metrics.EncoderTimeout},
		{fmt.Errorf("%w 500: x", errEncoderStatus), metrics.EncoderStatus},
		{fmt.Errorf("%w: x", errEncoderBadAnswer), metrics.EncoderBadAnswer},
		{&upstream.LegError{Addr: "a:1", Op: "dial", Err: context.Canceled}, metrics.EncoderUnreachable},
		{errCancelledByFailure, ""},
		{ErrClientGone, ""},
	} {
		assert.Equal(t, tc.reason, encoderReason(tc.err), "%v", tc.err)
	}
	for _, err := range []error{ErrNoEncoder, fmt.Errorf("%w for item 1: %w", ErrEncoderFailed, ErrEncoderTimeout)} {
		assert.Equal(t, 502, classify(err).status, "%v", err)
	}
}

// fakeEncoder is an in-process encoder: it answers each request with
// ec_transfer_params {"<url>": {"handle": "<name>"}, "by": ...} after delay, or status when set,
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
		fmt.Fprintf(rc, `{"id":"x","ec_transfer_params":{%q:{"handle":%q},"by":{"handle":%q}}}`, url, f.name, f.name)
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

func encodeProxy(t *testing.T, edit func(*EncoderConfig)) *Proxy {
	cfg := DefaultConfig()
	cfg.Encoder.Connector = connectors.ECNixl
	edit(&cfg.Encoder)
	p, err := New(cfg, nixlv2.New(), metrics.New(prometheus.NewRegistry(), 0), prometheus.NewRegistry(), zerolog.Nop())
	require.NoError(t, err)
	return p
}

// runStage runs the encoder stage of a chat request with n distinct
// images (and one duplicate) naming encoders; it returns the body after
// the stage and the error.
func runStage(p *Proxy, encoders string, n int) ([]byte, error) {
	parts := make([]string, 0, n+1)
	for i := range n {
		parts = append(parts, fmt.Sprintf(`{"type":"image_url","image_url":{"url":"u%d"}}`, i))
	}
	parts = append(parts, `{"type":"image_url","image_url":{"url":"u0"}}`)
	body := []byte(`{"model":"m","ec_transfer_params":{"own":1},"messages":[{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`)
	var rc fasthttp.RequestCtx
	rc.Request.Header.Set(HeaderEncoders, encoders)
	r := p.startRequest([]byte("rid"), &rc.Request.Header, body, "127.0.0.1:1", connectors.APIChat)
	r.rc = &rc
	defer r.cancel(context.Canceled)
	err := r.encode()
	return r.body, err
}

// TestFanOutRoundRobinAndMerge: item i goes to encoder i mod n, at most
// --encoder-max-concurrency at once, and the answers' ec_transfer_params
// are merged, in item order (a later key wins), into the request's own.
func TestFanOutRoundRobinAndMerge(t *testing.T) {
	legs := &legGauge{together: 2, reached: make(chan struct{})}
	a := &fakeEncoder{name: "a", delay: 20 * time.Millisecond, legs: legs}
	b := &fakeEncoder{name: "b", delay: 20 * time.Millisecond, legs: legs}
	p := encodeProxy(t, func(c *EncoderConfig) { c.MaxConcurrency = 2 })
	body, err := runStage(p, a.serve(t)+" , "+b.serve(t), 5)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"u0", "u2", "u4"}, a.items)
	assert.ElementsMatch(t, []string{"u1", "u3"}, b.items)
	assert.Equal(t, 2, legs.peak, "at most two legs at once")
	h := func(n string) string { return `{"handle":"` + n + `"}` }
	assert.JSONEq(t, `{"own":1,"u0":`+h("a")+`,"by":`+h("a")+`,"u1":`+h("b")+`,"u2":`+h("a")+`,"u3":`+h("b")+`,"u4":`+h("a")+`}`,
		gjson.GetBytes(body, "ec_transfer_params").Raw)
	assert.Equal(t, "0", gjson.GetBytes(body, "cache_hit_threshold").Raw)
	assert.Equal(t, `"own","u0","by","u1","u2","u3","u4"`,
		strings.Trim(gjson.GetBytes(body, "ec_transfer_params|@keys").Raw, "[]"), "keys in first-seen order")
}

// TestFanOutFailure: under error the first failure is the stage's error
// (502) and nothing is merged; under local the request continues with the
// successful legs' params only.
func TestFanOutFailure(t *testing.T) {
	ok, bad := &fakeEncoder{name: "ok"}, &fakeEncoder{name: "bad", status: 500}
	okAddr, badAddr := ok.serve(t), bad.serve(t)

	p := encodeProxy(t, func(*EncoderConfig) {})
	_, err := runStage(p, okAddr+","+badAddr, 2)
	require.ErrorIs(t, err, ErrEncoderFailed)
	assert.Equal(t, "encoder request failed for item 1: encoder: answered status 500", err.Error(), "the encoder's body is never said")
	assert.Equal(t, 502, classify(err).status)

	p = encodeProxy(t, func(c *EncoderConfig) { c.OnFailure = EncoderFailLocal })
	body, err := runStage(p, okAddr+","+badAddr, 2)
	require.NoError(t, err)
	assert.JSONEq(t, `{"own":1,"u0":{"handle":"ok"},"by":{"handle":"ok"}}`, gjson.GetBytes(body, "ec_transfer_params").Raw, "item 1 left to the engine")

	// An encoder that answers only once the test ends: the stage ends by
	// the 50 ms timeout (never before it; the upper bound has headroom for
	// any machine).
	release := make(chan struct{})
	slow := &fakeEncoder{name: "slow", hold: release}
	slowAddr := slow.serve(t)
	t.Cleanup(func() { close(release) }) // before the server's shutdown
	const timeout = 50 * time.Millisecond
	p = encodeProxy(t, func(c *EncoderConfig) { c.Timeout = timeout })
	start := time.Now()
	_, err = runStage(p, slowAddr, 1)
	took := time.Since(start)
	require.ErrorIs(t, err, ErrEncoderTimeout)
	require.ErrorIs(t, err, ErrEncoderFailed)
	assert.GreaterOrEqual(t, took, timeout)
	assert.Less(t, took, timeout+10*time.Second)
}
