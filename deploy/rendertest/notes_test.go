package rendertest_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest"
)

// TestNotesNameTheStatusPort: the install notes point `pd-sidecar status`
// at the port /debug/pd is served on: the metrics port when there is one
// (it moves /debug/pd off the proxy port), else the proxy port.
func TestNotesNameTheStatusPort(t *testing.T) {
	for _, tc := range []struct {
		name   string
		flags  map[string]any
		status string
	}{
		{"proxy port", map[string]any{"port": 8000}, "--url http://127.0.0.1:8000"},
		{"metrics port", map[string]any{"port": 8000, "metrics-port": 9090}, "--url http://127.0.0.1:9090"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch, err := loader.Load(chartDir)
			require.NoError(t, err)
			vals, err := util.ToRenderValues(ch, map[string]any{"sidecar": map[string]any{"flags": tc.flags}},
				common.ReleaseOptions{Name: rendertest.Release, Namespace: rendertest.Namespace, IsInstall: true}, common.DefaultCapabilities)
			require.NoError(t, err)
			files, err := engine.Render(ch, vals)
			require.NoError(t, err)
			notes := files["pd-sidecar/templates/NOTES.txt"]
			assert.Contains(t, notes, tc.status, notes)
			assert.Contains(t, notes, "(port 8000)", notes)
		})
	}
}
