// Package bootstrap keeps the answers of the prefillers' bootstrap servers
// (a connectors.Bootstrapper's GET, Mooncake's /query): each server is
// asked once, its answer reused for a while, for a bounded number of
// servers.
package bootstrap

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// ErrFailed: the prefiller's bootstrap server (Mooncake's GET /query)
// answered, but not with a usable answer.
var ErrFailed error = failure.New("prefiller bootstrap query failed", failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonBootstrapFailed})

// Bounds of the bootstrap query.
const (
	// timeout bounds one bootstrap query (vLLM's own bootstrap client uses
	// the same).
	timeout = 5 * time.Second
	// ttl is how long an answer is reused; a KV load failure forgets it
	// earlier (the prefiller may have restarted with a new id).
	ttl = 60 * time.Second
)

// TransportErr names an exchange with the bootstrap server at addr that
// failed in the transport: err is upstream.Transport.Do's error, with the
// query's cause (upstream.CtxErr) when its context is done. What it
// returns is what Cache.Get returns.
type TransportErr func(addr string, err error) error

// Cache remembers the bootstrap answer of each prefiller's bootstrap
// server, for at most max servers (then one is evicted). Safe for
// concurrent use.
type Cache struct {
	max   int
	named TransportErr
	now   func() time.Time

	mu sync.Mutex
	m  map[string]entry
}

type entry struct {
	b       connectors.Bootstrap
	expires time.Time
}

// New returns a cache of at most max answers, whose failed exchanges
// named names.
func New(max int, named TransportErr) *Cache {
	return &Cache{max: max, named: named, now: time.Now, m: make(map[string]entry)}
}

// Get returns prefillHost's bootstrap answer, from the cache or by one GET
// bounded by min(limit, the query's own bound), whose end is
// split.ErrPrefillTimeout. A transport failure is what the cache's
// TransportErr names it; a bad answer is ErrFailed.
func (c *Cache) Get(ctx context.Context, tr *upstream.Transport, bs connectors.Bootstrapper, prefillHost string, limit time.Duration) (connectors.Bootstrap, error) {
	if b, ok := c.Cached(bs, prefillHost); ok {
		return b, nil
	}
	addr := bs.BootstrapAddr(prefillHost)
	b, err := c.query(ctx, tr, bs, addr, min(limit, timeout))
	if err != nil {
		return b, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[addr]; !ok && len(c.m) >= c.max {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[addr] = entry{b: b, expires: c.now().Add(ttl)}
	return b, nil
}

// Cached returns prefillHost's bootstrap answer when the cache holds one
// still fresh (ok), without asking its server: what an event loop, which
// may not wait on the query, asks first.
func (c *Cache) Cached(bs connectors.Bootstrapper, prefillHost string) (b connectors.Bootstrap, ok bool) {
	c.mu.Lock()
	e, ok := c.m[bs.BootstrapAddr(prefillHost)]
	c.mu.Unlock()
	if !ok || !c.now().Before(e.expires) {
		return connectors.Bootstrap{}, false
	}
	return e.b, true
}

// Forget drops the answer cached for a bootstrap address.
func (c *Cache) Forget(addr string) {
	c.mu.Lock()
	delete(c.m, addr)
	c.mu.Unlock()
}

func (c *Cache) query(ctx context.Context, tr *upstream.Transport, bs connectors.Bootstrapper, addr string, timeout time.Duration) (connectors.Bootstrap, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, split.ErrPrefillTimeout)
	defer cancel()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.SetRequestURI(bs.BootstrapPath())
	req.Header.SetHost(addr)
	hold, err := tr.Do(ctx, addr, req, resp)
	defer hold.Release() // the answer is parsed here
	if err != nil {
		return connectors.Bootstrap{}, c.named(addr, upstream.CtxErr(ctx, err))
	}
	if st := resp.StatusCode(); st != fasthttp.StatusOK {
		return connectors.Bootstrap{}, fmt.Errorf("%w: %w", ErrFailed,
			&upstream.UpstreamError{Role: upstream.RoleBootstrap, Reason: fmt.Sprintf("answered %d", st), Addr: addr})
	}
	b, err := bs.ParseBootstrap(addr, resp.Body())
	if err != nil {
		return b, fmt.Errorf("%w: %w", ErrFailed, &upstream.UpstreamError{Role: upstream.RoleBootstrap, Reason: "unusable answer", Addr: addr, Err: err})
	}
	return b, nil
}
