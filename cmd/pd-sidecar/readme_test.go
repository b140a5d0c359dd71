package main

import (
	"bytes"
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestREADMEDocumentsEveryFlag keeps the README's flag table in step with
// the binary: every flag --help lists must appear in it.
func TestREADMEDocumentsEveryFlag(t *testing.T) {
	var usage bytes.Buffer
	_, err := parseFlags([]string{"--help"}, &usage)
	require.ErrorIs(t, err, errHelp)
	flags := regexp.MustCompile(`(?m)^\s+(--[a-z0-9-]+)`).FindAllStringSubmatch(usage.String(), -1)
	require.NotEmpty(t, flags)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, f := range flags {
		assert.Contains(t, string(readme), "`"+f[1]+"`", "README.md documents %s", f[1])
	}
}
