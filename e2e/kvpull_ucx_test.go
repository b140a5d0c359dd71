//go:build ucx

package e2e

import (
	"bytes"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestKVPullUCX runs the sidecar-pull e2e over the ucx transport (binaries
// built with -tags ucx; UCX picks its transports from UCX_TLS, tcp and
// shared memory on loopback).
func TestKVPullUCX(t *testing.T) { testKVPull(t, "ucx") }

// TestKVProbeUCXAgentKilled kills an agent's process while kv-probe reads
// it as fast as it can (hundreds of gets in flight, no pacing): the reader
// ends with a clear "kv source gone" error and exit status 1, never a UCX
// abort, whatever lanes UCX_TLS gives (shared memory, where the control
// connection watches the agent; tcp or cma, where UCX does).
func TestKVProbeUCXAgentKilled(t *testing.T) {
	for i := range 3 {
		port := harness.FreePort(t)
		agent := harness.StartEngineSim(t, "prefill", "--kv-agent-transport", "ucx", "--kv-agent-port", itoa(port),
			"--kv-region-dir", t.TempDir(), "--kv-bandwidth", "0")
		cmd := exec.Command(harness.Binary(t, "pd-sidecar"), "kv-probe", "--peer", harness.HostPort(port), "--transport", "ucx",
			"--block-sizes", "64KiB", "--size", "1GiB", "--count", "2")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		time.Sleep(time.Duration(200+100*i) * time.Millisecond) // inside the 1 GiB read
		agent.Kill()
		err := cmd.Wait()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "kv-probe finished before the kill: %s", out.String())
		assert.Equal(t, 1, exit.ExitCode(), "%s", out.String())
		assert.Contains(t, out.String(), "kv source gone")
		assert.NotContains(t, out.String(), "backtrace")
	}
}
