package rendertest_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest"
)

// The docs' values for this chart are rendered, so they cannot drift from
// the chart: every `--set key=value` of a `helm install|upgrade|template`
// of deploy/helm/pd-sidecar, every ```yaml block whose first line is
// "# values for deploy/helm/pd-sidecar", and every inline `sidecar.…`
// key (with its value when it shows one, `key: value` or `key=value`).
// An inline `flags.…` is refused: the chart reads sidecar.flags.

var (
	docSetRE    = regexp.MustCompile(`--set ([A-Za-z0-9_.-]+)=(\S+)`)
	docInlineRE = regexp.MustCompile("`((?:sidecar|flags)\\.[A-Za-z0-9_.-]+)(?:(?::\\s*|=)([^`]+))?`")
	docYAMLRE   = regexp.MustCompile("(?s)( *)```yaml\\n *# values for deploy/helm/pd-sidecar\\n(.*?)```")
)

// docFiles are the documents that show this chart's values.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"../../README.md"}
	more, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	return append(files, more...)
}

// setPath sets the dotted key to v (parsed as YAML, as helm --set reads a
// scalar) in values.
func setPath(values map[string]any, key, raw string) {
	var v any
	if err := yaml.Unmarshal([]byte(raw), &v); err != nil {
		v = raw
	}
	parts := strings.Split(key, ".")
	m := values
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
}

// hasPath reports whether the dotted key names a value of the chart's
// defaults (sidecar.flags.X: a flag the chart lists).
func hasPath(defaults map[string]any, key string) bool {
	var cur any = defaults
	for _, p := range strings.Split(key, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = m[p]; !ok {
			return false
		}
	}
	return true
}

func TestDocsValuesRender(t *testing.T) {
	raw, err := os.ReadFile(chartDir + "/values.yaml")
	require.NoError(t, err)
	var defaults map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &defaults))
	seen := 0
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		doc := string(b)
		name := filepath.Base(f)
		for _, line := range strings.Split(doc, "\n") {
			if !strings.Contains(line, "deploy/helm/pd-sidecar") && !strings.HasPrefix(strings.TrimSpace(line), "--set") {
				continue
			}
			for _, m := range docSetRE.FindAllStringSubmatch(line, -1) {
				values := map[string]any{}
				setPath(values, m[1], strings.Trim(m[2], "`\\"))
				_, err := rendertest.Render(chartDir, values)
				assert.NoError(t, err, "%s: --set %s=%s", name, m[1], m[2])
				seen++
			}
		}
		for _, m := range docInlineRE.FindAllStringSubmatch(doc, -1) {
			key, val := strings.TrimRight(m[1], "."), strings.TrimSpace(m[2])
			if strings.HasPrefix(key, "flags.") {
				t.Errorf("%s: `%s`: the chart reads sidecar.flags, not flags", name, m[0])
				continue
			}
			if strings.HasSuffix(key, "*") || !hasPath(defaults, key) {
				t.Errorf("%s: `%s` is not a value of deploy/helm/pd-sidecar", name, key)
				continue
			}
			if val == "" {
				continue
			}
			values := map[string]any{}
			setPath(values, key, val)
			_, err := rendertest.Render(chartDir, values)
			assert.NoError(t, err, "%s: %s", name, m[0])
			seen++
		}
		for _, m := range docYAMLRE.FindAllStringSubmatch(doc, -1) {
			var block strings.Builder // the block, out of its list indentation
			for _, l := range strings.Split(m[2], "\n") {
				block.WriteString(strings.TrimPrefix(l, m[1]) + "\n")
			}
			var values map[string]any
			require.NoError(t, yaml.Unmarshal([]byte(block.String()), &values), "%s: a values block", name)
			require.NotEmpty(t, values, "%s: a values block", name)
			_, err := rendertest.Render(chartDir, values)
			assert.NoError(t, err, "%s: values block:\n%s", name, block.String())
			seen++
		}
	}
	assert.Greater(t, seen, 5, "the docs show values of the chart")
}
