package rendertest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest"
)

// rulesOf renders the chart with values and returns its PrometheusRule's
// spec (nil: none rendered).
func rulesOf(t *testing.T, values map[string]any) map[string]any {
	t.Helper()
	o, err := rendertest.Render(chartDir, values)
	require.NoError(t, err)
	for _, obj := range o.Other {
		if obj["kind"] == "PrometheusRule" {
			return obj["spec"].(map[string]any)
		}
	}
	return nil
}

func ruleValues(rule map[string]any) map[string]any {
	return map[string]any{"metrics": map[string]any{"prometheusRule": rule}}
}

// TestPrometheusRuleIsTheRulesFile: off by default; on, with the default
// thresholds, the chart's PrometheusRule holds exactly the groups of
// deploy/prometheus/pd-sidecar-rules.yaml (which promtool tests); its
// values move the thresholds, the scrape job and the optional alert; what
// it renders passes promtool check rules when promtool is here.
func TestPrometheusRuleIsTheRulesFile(t *testing.T) {
	assert.Nil(t, rulesOf(t, nil), "opt-in")
	b, err := os.ReadFile("../prometheus/pd-sidecar-rules.yaml")
	require.NoError(t, err)
	var file map[string]any
	require.NoError(t, yaml.Unmarshal(b, &file))
	spec := rulesOf(t, ruleValues(map[string]any{"enabled": true}))
	require.NotNil(t, spec)
	assert.Equal(t, file["groups"], spec["groups"], "the chart renders the rules file as it is")

	custom := rulesOf(t, ruleValues(map[string]any{"enabled": true, "jobRegex": "decode-sidecars", "noPrefillerNamed": false,
		"thresholds": map[string]any{"fallbackRatio": 0.25, "kvTransferP99Seconds": 2.5, "prefillP99Seconds": 8, "rejectedPerSecond": 1, "errorRatio": 0.01}}))
	exprs := map[string]string{}
	for _, g := range custom["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			rule := r.(map[string]any)
			if name, ok := rule["alert"].(string); ok {
				exprs[name] = rule["expr"].(string)
			}
		}
	}
	assert.NotContains(t, exprs, "PDSidecarNoPrefillerNamed")
	for name, want := range map[string]string{
		"PDSidecarFallbackRatioHigh": "> 0.25", "PDSidecarKVTransferSlow": "> 2.5", "PDSidecarPrefillSlow": "> 8",
		"PDSidecarRequestsRejected": "> 1", "PDSidecarErrors": "> 0.01", "PDSidecarDown": `up{job=~"decode-sidecars"} == 0`,
		"PDSidecarNotScraped": `absent(up{job=~"decode-sidecars"})`,
	} {
		assert.Contains(t, exprs[name], want, name)
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool is not installed: the rendered rules were compared with the rules file, not checked by promtool (make test-rules installs it)")
		return
	}
	out, err := yaml.Marshal(map[string]any{"groups": custom["groups"]})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(path, out, 0o600))
	res, err := exec.Command(promtool, "check", "rules", path).CombinedOutput()
	require.NoError(t, err, "%s", res)
	assert.True(t, strings.Contains(string(res), "SUCCESS"), "%s", res)
}
