package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// errGone is the cause a test cancels a leg's context with, as a client
// leaving does.
var errGone = errors.New("client gone")

func newReq(addr, path string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(path)
	req.Header.SetHost(addr)
	req.SetBodyString(`{}`)
	return req
}

func TestTransportCancelsWhileWaitingForHead(t *testing.T) {
	left, arrived, end := make(chan struct{}), make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // net/http watches the connection once the body is read
		close(arrived)
		select {
		case <-r.Context().Done(): // never answers; sees the client leave
			close(left)
		case <-end:
		}
	}))
	defer srv.Close()
	defer close(end)
	addr := srv.Listener.Addr().String()
	tr := NewTransport(time.Second, 8, 8)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { <-arrived; cancel(errGone) }() // once the upstream holds the request
	resp := fasthttp.AcquireResponse()
	errc := make(chan error, 1)
	go func() { _, err := tr.Do(ctx, addr, newReq(addr, "/x"), resp); errc <- err }()
	var err error
	select {
	case err = <-errc:
	case <-time.After(30 * time.Second):
		t.Fatal("the call did not end with its context (the upstream never answers)")
	}
	require.Error(t, err)
	assert.ErrorIs(t, err, errGone)
	select {
	case <-left:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream never saw the leg cancelled")
	}
}

func TestTransportCancelsStreamedBody(t *testing.T) {
	left, end := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: 1\n\n"))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(left)
		case <-end:
		}
	}))
	defer srv.Close()
	defer close(end)
	addr := srv.Listener.Addr().String()
	tr := NewTransport(time.Second, 8, 8)
	ctx, cancel := context.WithCancelCause(context.Background())
	resp := fasthttp.AcquireResponse()
	leg, err := tr.Stream(ctx, addr, newReq(addr, "/s"), resp)
	require.NoError(t, err)
	buf := make([]byte, 64)
	n, err := leg.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "data: 1\n\n", string(buf[:n]))
	time.AfterFunc(50*time.Millisecond, func() { cancel(errGone) })
	_, err = io.ReadAll(leg)
	assert.ErrorIs(t, err, errGone)
	leg.Close()
	select {
	case <-left:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream never saw the leg cancelled")
	}
}

func TestTransportReusesConnections(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`ok`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	tr := NewTransport(time.Second, 8, 8)
	for range 5 {
		resp := fasthttp.AcquireResponse()
		leg, err := tr.Stream(context.Background(), addr, newReq(addr, "/"), resp)
		require.NoError(t, err)
		b, err := io.ReadAll(leg)
		require.NoError(t, err)
		assert.Equal(t, "ok", string(b))
		leg.Close()
		fasthttp.ReleaseResponse(resp)
	}
	assert.Equal(t, int32(1), conns.Load(), "a fully read leg returns its connection to the pool")
}

// TestTransportFirstByteTimeout: the first-byte timeout bounds the wait for
// the answer's beginning — no head in time fails the call, a head and no
// body in time fails the Leg's first Read, both with ErrFirstByteTimeout —
// and once the caller says the answer began (Leg.Began) the rest of the
// body is unbounded; the context still cancels.
func TestTransportFirstByteTimeout(t *testing.T) {
	// Long beside the moments the immediate answers take on a loaded
	// machine: an answer that begins at once is always in time.
	const firstByte = time.Second
	end := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // net/http watches the connection once the body is read
		if r.URL.Path == "/hang" {
			select { // never answers
			case <-r.Context().Done():
			case <-end:
			}
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush() // the head now, as vLLM sends it
		if r.URL.Path == "/began" {
			_, _ = w.Write([]byte("data: first\n\n"))
			w.(http.Flusher).Flush()
		}
		select { // the rest after the first-byte timeout
		case <-r.Context().Done():
			return
		case <-time.After(2 * firstByte):
		}
		_, _ = w.Write([]byte("data: late\n\n"))
	}))
	defer srv.Close()
	defer close(end)
	addr := srv.Listener.Addr().String()
	tr := NewTransport(time.Second, 8, 8)
	cases := []struct {
		name     string
		path     string
		ctxAfter time.Duration // cancel the context after this (0: never)
		wantErr  error         // from the call
		readErr  error         // from reading the body
		wantBody string
	}{
		{name: "no head in time", path: "/hang", wantErr: ErrFirstByteTimeout},
		{name: "a head and no body in time", path: "/head", readErr: ErrFirstByteTimeout},
		{name: "began in time, the rest slow", path: "/began", wantBody: "data: first\n\ndata: late\n\n"},
		{name: "context ends first", path: "/hang", ctxAfter: 30 * time.Millisecond, wantErr: errGone},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			if tc.ctxAfter > 0 {
				time.AfterFunc(tc.ctxAfter, func() { cancel(errGone) })
			}
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(resp)
			start := time.Now()
			leg, err := tr.StreamFirstByteTimeout(ctx, addr, newReq(addr, tc.path), resp, firstByte)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				if tc.wantErr == ErrFirstByteTimeout {
					assert.GreaterOrEqual(t, time.Since(start), firstByte)
				} else {
					assert.NotErrorIs(t, err, ErrFirstByteTimeout)
				}
				assert.Less(t, time.Since(start), firstByte+10*time.Second, "by the timeout or the context: /hang never answers")
				return
			}
			require.NoError(t, err)
			defer leg.Close()
			buf := make([]byte, 64)
			n, err := leg.Read(buf)
			if tc.readErr != nil {
				require.ErrorIs(t, err, tc.readErr)
				assert.GreaterOrEqual(t, time.Since(start), firstByte)
				return
			}
			require.NoError(t, err)
			leg.Began()
			rest, err := io.ReadAll(leg)
			require.NoError(t, err)
			assert.Equal(t, tc.wantBody, string(buf[:n])+string(rest))
		})
	}
}

// TestErrorsSayEachStepOnce: a leg's error names the step and the address
// once, whether the cause already says them (net's dial errors) or not.
func TestErrorsSayEachStepOnce(t *testing.T) {
	dialErr := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 8000}, Err: errors.New("connect: connection refused")}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&LegError{Addr: "10.0.0.5:8000", Op: "dial", Err: dialErr}, "dial tcp 10.0.0.5:8000: connect: connection refused"},
		{&LegError{Addr: "10.0.0.5:8000", Op: "dial", Err: context.DeadlineExceeded}, "dial 10.0.0.5:8000: context deadline exceeded"},
		{&LegError{Addr: "10.0.0.5:8000", Op: "read", Err: io.ErrUnexpectedEOF}, "read 10.0.0.5:8000: unexpected EOF"},
	} {
		assert.Equal(t, tc.want, tc.err.Error())
		assert.ErrorIs(t, tc.err, errors.Unwrap(tc.err))
	}
}

// TestTransportForgedHostsStayBounded: upstreams named by forged
// addresses neither grow the pool table past maxHosts nor each leave a
// goroutine behind.
func TestTransportForgedHostsStayBounded(t *testing.T) {
	tr := NewTransport(200*time.Millisecond, 8, 4)
	before := runtime.NumGoroutine()
	for i := range 2000 {
		addr := fmt.Sprintf("127.%d.%d.%d:1", 1+i>>16&127, i>>8&255, i&255)
		resp := fasthttp.AcquireResponse()
		_, err := tr.Do(context.Background(), addr, newReq(addr, "/x"), resp)
		fasthttp.ReleaseResponse(resp)
		require.Error(t, err)
	}
	assert.LessOrEqual(t, tr.Hosts(), 4, "pools kept for at most maxHosts upstreams")
	assert.Less(t, runtime.NumGoroutine()-before, 20, "no goroutine per forged upstream")
}

// TestTransportPooledHostKeepsItsSlot: an upstream in use keeps its pool
// while forged addresses come and go.
func TestTransportPooledHostKeepsItsSlot(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer srv.Close()
	good := srv.Listener.Addr().String()
	tr := NewTransport(200*time.Millisecond, 8, 2)
	do := func(addr string) error {
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		_, err := tr.Do(context.Background(), addr, newReq(addr, "/x"), resp)
		return err
	}
	require.NoError(t, do(good))
	for i := range 100 {
		_ = do(fmt.Sprintf("127.0.%d.%d:1", 1+i/250, i%250+1))
		require.NoError(t, do(good), "the real upstream keeps working")
	}
	assert.LessOrEqual(t, tr.Hosts(), 2)
}
