//go:build ucx

package e2e

import (
	"strings"
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
// connection watches the agent; tcp or cma, where UCX does). The probe
// repeats its 1 GiB read for ten minutes (--read-for) and says when it
// starts (--progress): the kill comes once the read has started, so it lands
// mid-read however fast the machine reads.
func TestKVProbeUCXAgentKilled(t *testing.T) {
	const started = "kv-probe: bandwidth read 1073741824 of 64KiB blocks started (pass 1)"
	for i := range 3 {
		port := harness.FreePort(t)
		agent := harness.StartEngineSim(t, "prefill", "--kv-agent-transport", "ucx", "--kv-agent-port", itoa(port),
			"--kv-region-dir", t.TempDir(), "--kv-bandwidth", "0")
		probe := harness.Start(t, harness.Binary(t, "pd-sidecar"), "kv-probe", "--peer", harness.HostPort(port), "--transport", "ucx",
			"--block-sizes", "64KiB", "--size", "1GiB", "--count", "2", "--read-for", "10m", "--progress")
		harness.Eventually(t, 60*time.Second, "kv-probe started its bandwidth read", func() bool {
			return strings.Contains(probe.Output(), started) || probe.Exited()
		})
		require.Contains(t, probe.Output(), started, "kv-probe ended before its bandwidth read")
		// A different point of the read each time; the read runs for ten
		// minutes, so the pause never outlasts it.
		time.Sleep(time.Duration(100*i) * time.Millisecond)
		require.False(t, probe.Exited(), "kv-probe ended before the kill, mid-read: %s", probe.Output())
		agent.Kill()
		code, err := probe.Wait(2 * time.Minute)
		require.NoError(t, err, "kv-probe still running 2 minutes after its agent was killed: %s", probe.Output())
		out := probe.Output()
		assert.Equal(t, 1, code, "%s", out)
		assert.Contains(t, out, "kv-probe: 65536-byte blocks: ", "the error comes from the bandwidth read")
		assert.Contains(t, out, "kv source gone")
		assert.NotContains(t, out, "verdict:")
		assert.NotContains(t, out, "backtrace")
	}
}
