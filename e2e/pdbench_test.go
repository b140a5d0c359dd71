package e2e

import (
	"encoding/json"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// TestPDBenchSmoke runs the real pd-bench binary against engine-sim for a
// moment and checks the report is well formed: every target answered,
// nothing failed, tokens add up. It asserts nothing about speed.
func TestPDBenchSmoke(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill", "--decode-us-per-token", "0")
	decode := harness.StartEngineSim(t, "decode", "--decode-us-per-token", "0")
	plot := filepath.Join(t.TempDir(), "bench.png")
	cmd := exec.Command(harness.Binary(t, "pd-bench"),
		"--target", "direct="+decode.URL(),
		"--target", "floor="+decode.URL(), "--prefill-target", "floor="+prefill.URL(),
		"--model", "sim-model", "--clients", "4", "--duration", "400ms", "--rounds", "2", "--warmup", "0s",
		"--prompt-tokens", "32-64", "--output-tokens", "8", "--shared-prefix", "0.5",
		"--json", "--quiet", "--plot", plot)
	out, err := cmd.Output()
	require.NoError(t, err, "pd-bench: %s", out)

	var rep loadgen.Report
	require.NoError(t, json.Unmarshal(out, &rep), "JSON report: %s", out)
	require.Len(t, rep.Targets, 2)
	for i, name := range []string{"direct", "floor"} {
		s := rep.Targets[i]
		assert.Equal(t, name, s.Name)
		assert.Positive(t, s.OK, "%s answered", name)
		assert.Equal(t, s.Requests, s.OK, "%s: no errors: %v", name, s.Errors)
		assert.Empty(t, s.Errors)
		assert.Zero(t, s.CutShort)
		assert.Equal(t, 8*s.OK, s.Tokens, "%s: every stream carried its 8 tokens", name)
		assert.Positive(t, s.ReqPerSec)
		assert.Positive(t, s.TTFT.P50)
		assert.LessOrEqual(t, s.TTFT.P50, s.TTFT.P99)
		assert.LessOrEqual(t, s.E2E.P99, s.E2E.Max)
	}
	assert.Equal(t, float64(rep.Targets[1].OK), prefill.Metric(t, "sim_remote_decode_prefills_total", nil),
		"the floor target ran one real prefill per request")
	assert.Equal(t, float64(rep.Targets[1].OK), decode.Metric(t, "sim_remote_kv_decodes_total", nil),
		"and one decode on pulled KV per request")

	f, err := os.Open(plot)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err, "the plot is a PNG")
	assert.Greater(t, img.Bounds().Dx(), 100)
}
