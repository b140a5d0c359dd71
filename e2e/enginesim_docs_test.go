package e2e

import (
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestEngineSimDocsListEveryFlag keeps docs/engine-sim.md (the engine-sim
// reference) in step with the binary's flags.
func TestEngineSimDocsListEveryFlag(t *testing.T) {
	out, _ := exec.Command(harness.Binary(t, "engine-sim"), "--help").CombinedOutput()
	flags := regexp.MustCompile(`(?m)^\s+(--[a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1)
	require.NotEmpty(t, flags, "engine-sim --help: %s", out)
	doc, err := os.ReadFile(harness.RepoRoot(t) + "/docs/engine-sim.md")
	require.NoError(t, err)
	for _, f := range flags {
		assert.Contains(t, string(doc), "`"+f[1]+"`", "docs/engine-sim.md documents %s", f[1])
	}
}

// TestEngineSimDocsListEveryMetric keeps docs/engine-sim.md's metric lists
// in step with what engine-sim exports.
func TestEngineSimDocsListEveryMetric(t *testing.T) {
	e := harness.StartEngineSim(t, "both")
	doc, err := os.ReadFile(harness.RepoRoot(t) + "/docs/engine-sim.md")
	require.NoError(t, err)
	m := harness.Scrape(t, e.URL()+"/metrics")
	require.NotEmpty(t, m)
	for name := range m {
		assert.Regexp(t, "`"+regexp.QuoteMeta(name)+"(`|\\{)", string(doc), "docs/engine-sim.md documents %s", name)
	}
}
