package e2e

import (
	"encoding/pem"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// A split whose prefill leg goes over TLS (--enable-tls=prefiller) is the
// lane's too: its prefill leg is sent by the transport off the loop, the
// rest of it on the loop. TestLaneTLSPrefillAnswersAsTheServer runs its
// outcomes twice, on rigs of their own, sent whole (the lane's) and with
// its head in two writes (fasthttp's), against a prefill engine behind a
// TLS front whose certificate the sidecar verifies (--tls-ca-file), and
// requires the same answers and counts, and the split proven by the
// engines' counters.

// tlsFront is a TLS server in front of the engine at target; its
// certificate's PEM is written to the returned file.
func tlsFront(t *testing.T, target string) (addr, caFile string) {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	ts := httptest.NewTLSServer(httputil.NewSingleHostReverseProxy(u))
	t.Cleanup(ts.Close)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600))
	return strings.TrimPrefix(ts.URL, "https://"), caFile
}

func TestLaneTLSPrefillAnswersAsTheServer(t *testing.T) {
	completion := completionBody(`,"max_tokens":6`)
	stream := chatBody(`,"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}`)
	for _, tc := range []struct {
		name           string
		flags          []string
		prefillFault   string
		path, body     string
		status         int
		remoteDecodes  float64
		fallbackReason string
	}{
		{name: "split", path: "/v1/completions", body: completion, status: 200, remoteDecodes: 1},
		{name: "split stream", path: "/v1/chat/completions", body: stream, status: 200, remoteDecodes: 1},
		{name: "prefiller 500 falls back", prefillFault: `{"status":500}`, path: "/v1/completions", body: completion,
			status: 200, fallbackReason: "server_error"},
		{name: "retried then split", flags: []string{"--prefill-max-retries", "2", "--prefill-retry-backoff", "10ms"},
			prefillFault: `{"status":503,"times":1}`, path: "/v1/chat/completions", body: stream, status: 200, remoteDecodes: 1},
		{name: "prefiller hangs times out", flags: []string{"--prefill-timeout", "300ms"}, prefillFault: `{"hang":true}`,
			path: "/v1/completions", body: completion, status: 200, fallbackReason: "timeout"},
		{name: "prefiller 400 passed on", prefillFault: `{"status":400}`, path: "/v1/completions", body: completion, status: 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(whole bool) splitOutcome {
				rig := &pdRig{prefill: harness.StartEngineSim(t, "prefill"), decode: harness.StartEngineSim(t, "decode")}
				front, ca := tlsFront(t, rig.prefill.URL())
				rig.sc = harness.StartSidecar(t, rig.decode.Port, append([]string{"--enable-tls=prefiller", "--tls-ca-file", ca}, tc.flags...)...)
				if tc.prefillFault != "" {
					setFault(t, rig.prefill, tc.prefillFault)
				}
				o := sendRaw(t, rig.sc.Port, tc.path, tc.body, map[string]string{"x-prefiller-host-port": front}, whole, 0)
				harness.Eventually(t, 30*time.Second, "the request ended, the upstreams' work with it", func() bool {
					return rig.scMetric(t, "pd_sidecar_inflight_requests", nil) == 0 && running(t, rig.prefill) == 0 && running(t, rig.decode) == 0
				})
				assertServedBy(t, whole, rig.scMetric(t, laneRequests, nil))
				assert.Equal(t, tc.remoteDecodes, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil), "decoded on remote KV (whole: %v)", whole)
				if tc.fallbackReason != "" {
					assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": tc.fallbackReason}), "whole: %v", whole)
				}
				o.sidecar = series(harness.Scrape(t, rig.sc.URL()+"/metrics"), splitCountered)
				o.prefill = series(harness.Scrape(t, rig.prefill.URL()+"/metrics"), engineCountered)
				o.decode = series(harness.Scrape(t, rig.decode.URL()+"/metrics"), engineCountered)
				return o
			}
			lane, server := run(true), run(false)
			assertSameOutcome(t, tc.status, lane, server)
		})
	}
}
