package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestSidecarConfigurationFile starts the real sidecar with nothing but
// --configuration-file (its port, the engine's, the connector and the
// timeouts all in the file) and one command-line flag that overrides the
// file, and serves a split through it.
func TestSidecarConfigurationFile(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	port := harness.FreePorts(t, 4)
	fileMetrics, cliMetrics := harness.FreePort(t), harness.FreePort(t)
	file := filepath.Join(t.TempDir(), "sidecar.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`
port: %d
model-server-port: %d
kv-connector: nixlv2
metrics-port: %d
prefill-timeout: 2s
connect-timeout: 1s
shutdown-grace: 10s
enable-tls: []
log-level: debug
`, port, decode.Port, fileMetrics)), 0o600))
	sc := &harness.Sidecar{Port: port}
	sc.Proc = harness.Start(t, harness.Binary(t, "pd-sidecar"),
		"--configuration-file", file, "--metrics-port", fmt.Sprint(cliMetrics))
	sc.WaitHTTP(t, sc.URL()+"/health", 30*time.Second)

	st, b, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":8`),
		map[string]string{"x-prefiller-host-port": prefill.HostPort()})
	require.Equal(t, http.StatusOK, st, "%s", b)
	assert.NotEmpty(t, textOf(b))
	assert.Equal(t, 1.0, decode.Metric(t, "sim_remote_kv_decodes_total", nil), "decoded on the prefiller's KV")
	assert.Equal(t, 1.0, prefill.Metric(t, "sim_remote_decode_prefills_total", nil))
	metrics := harness.URL(cliMetrics) + "/metrics"
	assert.Equal(t, 1.0, harness.Metric(t, metrics, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}),
		"the command line's --metrics-port wins over the file's")
}
