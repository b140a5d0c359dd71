package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestPDBenchMultiturnSmoke runs `pd-bench multiturn` cut to two
// conversations of three short turns and checks what does not depend on
// timing: it runs to its budget table, every turn from the second on used
// its history, and the answers of both modes are the same. The TTFT
// verdicts are not asserted: too short a run to measure.
func TestPDBenchMultiturnSmoke(t *testing.T) {
	bench := harness.Binary(t, "pd-bench")
	harness.Binary(t, "engine-sim")
	harness.Binary(t, "pd-sidecar")
	cmd := exec.Command(bench, "multiturn", "--bin", filepath.Dir(bench), "--dir", t.TempDir(),
		"--conversations", "2", "--turns", "3", "--user-words", "200-300", "--max-tokens", "20",
		"--think-time", "0s", "--prefill-per-token", "5us", "--decode-per-token", "100us")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "pd-bench multiturn: %s", out)
	for _, want := range []string{"== Per turn", "== Budget ==", "a history on every turn from 2 on: 4", "answers identical in both modes: 6 of 6 turns"} {
		assert.Contains(t, string(out), want)
	}
}
