package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/failure"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// ErrBootstrapFailed: the prefiller's bootstrap server (Mooncake's
// GET /query) answered, but not with a usable answer.
var ErrBootstrapFailed error = failure.New("prefiller bootstrap query failed", failure.Outcome{Status: http.StatusBadGateway, Reason: ReasonBootstrapFailed})

// Bounds of the bootstrap query.
const (
	// bootstrapTimeout bounds one bootstrap query (vLLM's own bootstrap
	// client uses the same).
	bootstrapTimeout = 5 * time.Second
	// bootstrapTTL is how long an answer is reused; a KV load failure
	// forgets it earlier (the prefiller may have restarted with a new id).
	bootstrapTTL = 60 * time.Second
)

// bootstrapCache remembers the bootstrap answer of each prefiller's
// bootstrap server, for at most max servers (then one is evicted).
type bootstrapCache struct {
	max int
	now func() time.Time

	mu sync.Mutex
	m  map[string]bootstrapEntry
}

type bootstrapEntry struct {
	b       connectors.Bootstrap
	expires time.Time
}

func newBootstrapCache(max int) *bootstrapCache {
	return &bootstrapCache{max: max, now: time.Now, m: make(map[string]bootstrapEntry)}
}

// get returns prefillHost's bootstrap answer, from the cache or by one GET
// bounded by min(limit, bootstrapTimeout). A transport failure is a prefill
// transport error (ErrPrefillUnreachable, ErrPrefillTimeout); a bad answer
// is ErrBootstrapFailed.
func (c *bootstrapCache) get(ctx context.Context, tr *upstream.Transport, bs connectors.Bootstrapper, prefillHost string, limit time.Duration) (connectors.Bootstrap, error) {
	addr := bs.BootstrapAddr(prefillHost)
	c.mu.Lock()
	e, ok := c.m[addr]
	c.mu.Unlock()
	if ok && c.now().Before(e.expires) {
		return e.b, nil
	}
	b, err := query(ctx, tr, bs, addr, min(limit, bootstrapTimeout))
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
	c.m[addr] = bootstrapEntry{b: b, expires: c.now().Add(bootstrapTTL)}
	return b, nil
}

// forget drops the answer cached for a bootstrap address.
func (c *bootstrapCache) forget(addr string) {
	c.mu.Lock()
	delete(c.m, addr)
	c.mu.Unlock()
}

func query(ctx context.Context, tr *upstream.Transport, bs connectors.Bootstrapper, addr string, timeout time.Duration) (connectors.Bootstrap, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrPrefillTimeout)
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
		ue := upstreamErr(upstream.RoleBootstrap, addr, upstream.CtxErr(ctx, err))
		if errors.Is(err, upstream.ErrBadUpstreamAnswer) {
			return connectors.Bootstrap{}, fmt.Errorf("%w: %w", ErrBootstrapFailed, ue)
		}
		return connectors.Bootstrap{}, prefillTransportErr(ue) // unreachable, timed out: as the prefiller
	}
	if st := resp.StatusCode(); st != fasthttp.StatusOK {
		return connectors.Bootstrap{}, fmt.Errorf("%w: %w", ErrBootstrapFailed,
			&upstream.UpstreamError{Role: upstream.RoleBootstrap, Reason: fmt.Sprintf("answered %d", st), Addr: addr})
	}
	b, err := bs.ParseBootstrap(addr, resp.Body())
	if err != nil {
		return b, fmt.Errorf("%w: %w", ErrBootstrapFailed, &upstream.UpstreamError{Role: upstream.RoleBootstrap, Reason: "unusable answer", Addr: addr, Err: err})
	}
	return b, nil
}
