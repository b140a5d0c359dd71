package bootstrap

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// fakeServer is a bootstrap server answering status (0: 200) with the
// engine id "e", or not at all while hang; it counts the queries.
type fakeServer struct {
	status  atomic.Int32
	hang    atomic.Bool
	queries atomic.Int32
}

func (f *fakeServer) serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) {
		f.queries.Add(1)
		if f.hang.Load() {
			time.Sleep(300 * time.Millisecond)
		}
		if st := f.status.Load(); st != 0 {
			rc.SetStatusCode(int(st))
		}
		rc.SetBodyString(`e`)
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// fakeBootstrapper asks every prefiller's bootstrap server at addr, and
// takes any answer but "bad".
type fakeBootstrapper struct{ addr string }

func (f fakeBootstrapper) BootstrapAddr(string) string { return f.addr }
func (f fakeBootstrapper) BootstrapPath() string       { return "/query" }
func (f fakeBootstrapper) ParseBootstrap(addr string, answer []byte) (connectors.Bootstrap, error) {
	if string(answer) == "bad" {
		return connectors.Bootstrap{}, connectors.ErrBadBootstrap
	}
	return connectors.Bootstrap{URL: "http://" + addr, EngineID: string(answer)}, nil
}

var errNamed = errors.New("named transport failure")

// testCache is a cache of at most max answers with a settable clock, whose
// transport failures are errNamed around the transport's error.
func testCache(max int) (*Cache, *time.Time) {
	c := New(max, func(addr string, err error) error { return errors.Join(errNamed, err) })
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	return c, &now
}

func TestCacheGet(t *testing.T) {
	f := &fakeServer{}
	bs := fakeBootstrapper{addr: f.serve(t)}
	tr := upstream.NewTransport(time.Second, 4, 4)
	ctx := context.Background()
	c, now := testCache(4)

	b, err := c.Get(ctx, tr, bs, "p", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, "e", b.EngineID)
	_, err = c.Get(ctx, tr, bs, "p", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, int32(1), f.queries.Load(), "reused within the TTL")

	*now = now.Add(ttl)
	_, err = c.Get(ctx, tr, bs, "p", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, int32(2), f.queries.Load(), "asked again once expired")

	c.Forget(bs.addr)
	_, err = c.Get(ctx, tr, bs, "p", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, int32(3), f.queries.Load(), "asked again once forgotten")
}

// Cached answers from the cache alone: never a query, nothing once the
// answer expired or was forgotten.
func TestCacheCached(t *testing.T) {
	f := &fakeServer{}
	bs := fakeBootstrapper{addr: f.serve(t)}
	tr := upstream.NewTransport(time.Second, 4, 4)
	c, now := testCache(4)

	_, ok := c.Cached(bs, "p")
	assert.False(t, ok, "nothing cached yet")
	assert.Zero(t, f.queries.Load(), "Cached never asks")
	_, err := c.Get(context.Background(), tr, bs, "p", time.Minute)
	require.NoError(t, err)
	b, ok := c.Cached(bs, "p")
	require.True(t, ok)
	assert.Equal(t, "e", b.EngineID)

	*now = now.Add(ttl)
	_, ok = c.Cached(bs, "p")
	assert.False(t, ok, "expired")
	*now = now.Add(-ttl)
	c.Forget(bs.addr)
	_, ok = c.Cached(bs, "p")
	assert.False(t, ok, "forgotten")
	assert.Equal(t, int32(1), f.queries.Load())
}

func TestCacheFailures(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		hang    bool
		closed  bool // nothing listens
		want    error
		wantNot error
	}{
		{name: "an error status", status: 503, want: ErrFailed, wantNot: errNamed},
		{name: "no answer within the limit", hang: true, want: errNamed, wantNot: ErrFailed},
		{name: "unreachable", closed: true, want: errNamed, wantNot: ErrFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeServer{}
			f.status.Store(int32(tc.status))
			f.hang.Store(tc.hang)
			addr := f.serve(t)
			if tc.closed {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				addr = ln.Addr().String()
				require.NoError(t, ln.Close())
			}
			c, _ := testCache(4)
			_, err := c.Get(context.Background(), upstream.NewTransport(time.Second, 4, 4), fakeBootstrapper{addr: addr}, "p", 50*time.Millisecond)
			require.ErrorIs(t, err, tc.want)
			if tc.wantNot != nil {
				assert.NotErrorIs(t, err, tc.wantNot)
			}
			assert.Empty(t, c.m, "a failure is not cached")
		})
	}
}

func TestCacheBound(t *testing.T) {
	tr := upstream.NewTransport(time.Second, 4, 4)
	c, _ := testCache(2)
	for range 3 {
		f := &fakeServer{}
		_, err := c.Get(context.Background(), tr, fakeBootstrapper{addr: f.serve(t)}, "p", time.Minute)
		require.NoError(t, err)
		assert.LessOrEqual(t, len(c.m), 2)
	}
	assert.Len(t, c.m, 2, "one evicted past the bound")
}
