package benchsuite

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

// ServeReferenceProxy serves Go's standard streaming reverse proxy
// (net/http/httputil.ReverseProxy, flushing every write) on addr in front
// of upstream until ctx is done. It is what a Go sidecar built the usual way
// costs (llm-d's sidecar is built on it), measured in the same run as
// pd-sidecar; it is not llm-d's sidecar.
func ServeReferenceProxy(ctx context.Context, addr, upstream string) error {
	u, err := url.Parse("http://" + upstream)
	if err != nil {
		return fmt.Errorf("upstream %q: %w", upstream, err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	rp.Transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	srv := &http.Server{Addr: addr, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
