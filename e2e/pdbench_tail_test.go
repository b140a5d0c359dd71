package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestPDBenchTailSmoke runs `pd-bench tail` with every scenario cut to a
// moment and checks that it runs to its budget table. It asserts nothing
// about the verdicts: too short a run to measure a tail.
func TestPDBenchTailSmoke(t *testing.T) {
	bench := harness.Binary(t, "pd-bench")
	harness.Binary(t, "engine-sim")
	harness.Binary(t, "pd-sidecar")
	cmd := exec.Command(bench, "tail", "--bin", filepath.Dir(bench), "--dir", t.TempDir(),
		"--prompt-tokens", "200", "--rate", "10", "--duration", "1s", "--rounds", "1", "--warmup", "0s",
		"--handshake-delay", "300ms", "--warm-requests", "2",
		"--short-rate", "20", "--short-duration", "500ms",
		"--kill-rate", "50", "--kill-before", "300ms", "--kill-down", "500ms", "--kill-after", "1s",
		"--leave-rate", "20", "--leave-duration", "1s", "--leave-after", "150ms", "--decode-hold", "400ms", "--leave-watch", "500ms")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "pd-bench tail: %s", out)
	for _, want := range []string{"== 1. One prefiller of four slow", "== 2. Cold prefiller", "== 3. Short prompts",
		"== 4. A prefiller killed", "right after the prefill", "== Budget ==", "budget lines met"} {
		assert.Contains(t, string(out), want)
	}
	assert.NotContains(t, string(out), "errors:", "no request failed: %s", out)
}
