package core

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

func newReq(addr, path string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(path)
	req.Header.SetHost(addr)
	req.SetBodyString(`{}`)
	return req
}

// TestTransportDeadline: a leg past its context's deadline fails with the
// context's cause, which the prefill's classification keeps.
func TestTransportDeadline(t *testing.T) {
	end := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		select { // never answers
		case <-r.Context().Done():
		case <-end:
		}
	}))
	defer srv.Close()
	defer close(end)
	addr := srv.Listener.Addr().String()
	ctx, cancel := context.WithTimeoutCause(context.Background(), 100*time.Millisecond, split.ErrPrefillTimeout)
	defer cancel()
	_, err := upstream.NewTransport(time.Second, 8, 8).Do(ctx, addr, newReq(addr, "/"), fasthttp.AcquireResponse())
	assert.ErrorIs(t, PrefillTransportErr(err), split.ErrPrefillTimeout)
}

// TestTransportRefusedIsDecodeUnavailable: a refused dial is an upstream.LegError of
// the dial step, a local engine unavailable, a prefiller unreachable.
func TestTransportRefusedIsDecodeUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	_, err = upstream.NewTransport(time.Second, 8, 8).Do(context.Background(), addr, newReq(addr, "/"), fasthttp.AcquireResponse())
	require.Error(t, err)
	assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "%v", err)
	assert.ErrorIs(t, DecodeTransportErr(err), ErrDecodeUnavailable)
	assert.ErrorIs(t, PrefillTransportErr(err), ErrPrefillUnreachable)
	var le *upstream.LegError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "dial", le.Op)
}
