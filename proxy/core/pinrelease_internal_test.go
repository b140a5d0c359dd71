package core

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvrelease"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// allowOnly admits one address.
type allowOnly string

func (a allowOnly) Allowed(hp string) bool { return hp == string(a) }

// TestPinReleaserLegs: a release leg goes to a prefiller still on the
// allowlist as a POST /v1/completions of the body under an id of its own
// and no client header; one whose prefiller left the allowlist is not sent
// (not_allowed).
func TestPinReleaserLegs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	got := make(chan *http.Request, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				got <- req
				_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
			}()
		}
	}()
	counts := metrics.NewMultiturn(prometheus.NewRegistry()).PinReleases
	tests := []struct {
		name      string
		allowlist ssrf.Allowlist
		outcome   string
	}{
		{"SSRF protection off", nil, metrics.PinReleaseSent},
		{"still allowed", allowOnly(ln.Addr().String()), metrics.PinReleaseSent},
		{"left the allowlist", allowOnly("10.0.0.1:8000"), metrics.PinReleaseNotAllowed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := kvrelease.New(kvrelease.PinLegs, nil, upstream.NewTransport(time.Second, 8, 8), counts)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { r.Run(ctx); close(done) }()
			pr := &pinReleaser{r: r, allowlist: tc.allowlist, counts: counts, log: zerolog.Nop()}
			before := testutil.ToFloat64(counts.WithLabelValues(tc.outcome))
			pr.ReleasePin(ln.Addr().String(), []byte(`{"model":"m","prompt":"release"}`))
			require.Eventually(t, func() bool { return testutil.ToFloat64(counts.WithLabelValues(tc.outcome)) == before+1 }, 5*time.Second, 10*time.Millisecond)
			cancel()
			<-done
			if tc.outcome != metrics.PinReleaseSent {
				assert.Empty(t, got, "nothing sent")
				return
			}
			req := <-got
			assert.Equal(t, "/v1/completions", req.URL.Path)
			assert.Regexp(t, `^history-release-`, req.Header.Get("X-Request-Id"))
			assert.Equal(t, "application/json", req.Header.Get("Content-Type"))
			assert.Empty(t, req.Header.Get("Authorization"))
		})
	}
}
