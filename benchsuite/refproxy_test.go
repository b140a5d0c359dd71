package benchsuite

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReferenceProxy: the reference proxy streams the upstream's answer
// through and stops with its context.
func TestReferenceProxy(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			_, _ = io.WriteString(w, "data: "+strconv.Itoa(i)+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	defer upstream.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeReferenceProxy(ctx, addr, upstream.Listener.Addr().String()) }()
	var resp *http.Response
	require.Eventually(t, func() bool {
		resp, err = http.Post("http://"+addr+"/v1/chat/completions", "application/json", nil)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, "data: 0\n\ndata: 1\n\ndata: 2\n\n", string(b))
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the reference proxy did not stop with its context")
	}
}

func TestGeneratedTokens(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "# HELP vllm:generation_tokens_total x\nvllm:generation_tokens_total_other 5\n"+
			"vllm:generation_tokens_total{engine=\"0\",model_name=\"m\"} 1234\n")
	}))
	defer srv.Close()
	n, err := generatedTokens(context.Background(), srv.URL)
	if err != nil || n != 1234 {
		t.Fatalf("generatedTokens = %v, %v; want 1234", n, err)
	}
}
