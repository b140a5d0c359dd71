package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRender: values files merge in order (the later wins) over the
// chart's defaults, and a missing file is exit 2 with one line.
func TestRender(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.yaml")
	b := filepath.Join(dir, "b.yaml")
	require.NoError(t, os.WriteFile(a, []byte("sidecar:\n  image:\n    repository: registry.example/a/pd-sidecar\n    tag: \"1\"\n"), 0o600))
	require.NoError(t, os.WriteFile(b, []byte("sidecar:\n  image:\n    tag: \"2\"\n"), 0o600))
	var out, errb bytes.Buffer
	code := run([]string{"-chart", "../helm/pd-sidecar", "-name", "qwen", "-namespace", "llm", "-f", a, "-f", b}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Contains(t, out.String(), `image: "registry.example/a/pd-sidecar:2"`, "the later file wins, the earlier one still applies")
	assert.Contains(t, out.String(), "name: qwen-pd-sidecar")
	assert.Contains(t, out.String(), "# Source: pd-sidecar/templates/")

	out.Reset()
	errb.Reset()
	assert.Equal(t, 2, run([]string{"-chart", "../helm/pd-sidecar", "-f", filepath.Join(dir, "missing.yaml")}, &out, &errb))
	assert.Equal(t, 1, bytes.Count(errb.Bytes(), []byte("\n")), errb.String())
}
