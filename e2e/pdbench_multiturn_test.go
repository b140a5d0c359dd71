package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestPDBenchMultiturnSmoke runs `pd-bench multiturn` cut to four
// conversations of three short turns, one of them abandoned after its
// first, in the without, with-conversation, with-pod and a short-TTL
// with-none mode, and checks what does not depend on timing: it runs to
// its criteria table; in the with-conversation mode every turn from the
// second on used its history and computed within its budget, turn by turn
// from engine-sim's ledger; the pinned KV is reported for every with
// mode; and the answers of every mode are the same. The TTFT verdicts are
// not asserted: too short a run to measure. What the pod and none modes
// reuse depends on the sidecar's lookup and is not asserted either.
func TestPDBenchMultiturnSmoke(t *testing.T) {
	bench := harness.Binary(t, "pd-bench")
	harness.Binary(t, "engine-sim")
	harness.Binary(t, "pd-sidecar")
	cmd := exec.Command(bench, "multiturn", "--bin", filepath.Dir(bench), "--dir", t.TempDir(),
		"--modes", "without,with-conversation,with-pod,with-none@3s",
		"--conversations", "4", "--abandon", "0.25", "--turns", "3", "--user-words", "200-300", "--max-tokens", "20",
		"--think-time", "0s", "--prefill-per-token", "5us", "--decode-per-token", "100us", "--tail", "1s")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "pd-bench multiturn: %s", out)
	for _, want := range []string{
		"== with-conversation:", "== Pinned KV on the decode engine", "== Criteria (per with mode) ==",
		"multiturn uses 6 (turns from 2 on: 6)",
		"6 of 6 turns (100.0 %)",
		"answers token-identical to without",
	} {
		assert.Contains(t, string(out), want)
	}
	assert.Regexp(t, `with-conversation\s+answers token-identical to without\s+10 of 10 turns\s+PASS`, string(out))
	assert.Regexp(t, `with-pod\s+answers token-identical to without\s+10 of 10 turns\s+PASS`, string(out))
	assert.Regexp(t, `with-none@3s\s+answers token-identical to without\s+10 of 10 turns\s+PASS`, string(out))
	assert.Regexp(t, `(?m)^\s*with-none@3s\s+3s\s`, string(out), "the pinned KV table has the short-TTL mode")
}
