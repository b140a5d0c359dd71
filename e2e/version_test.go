package e2e

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestVersionAndBuildInfo: the binary's --version and its
// pd_sidecar_build_info gauge name the same build.
func TestVersionAndBuildInfo(t *testing.T) {
	out, err := exec.Command(harness.Binary(t, "pd-sidecar"), "--version").Output()
	require.NoError(t, err)
	line := strings.TrimSpace(string(out))
	require.Regexp(t, `^pd-sidecar \S+, commit \S+( \(modified\))?, built with go\S+$`, line)
	engine := harness.StartEngineSim(t, "decode")
	sc := harness.StartSidecar(t, engine.Port)
	m := harness.Scrape(t, sc.URL()+"/metrics")["pd_sidecar_build_info"]
	require.NotNil(t, m)
	require.Len(t, m.GetMetric(), 1)
	labels := map[string]string{}
	for _, l := range m.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	assert.Equal(t, 1.0, m.GetMetric()[0].GetGauge().GetValue())
	assert.Contains(t, line, "pd-sidecar "+labels["version"]+", commit "+labels["revision"])
	assert.Contains(t, line, "built with "+labels["go_version"])
}
