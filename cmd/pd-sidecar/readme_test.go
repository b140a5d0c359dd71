package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flagsDoc is the generated flag reference; README.md links it.
const flagsDoc = "../../docs/flags.md"

// helpLineRE reads one flag line of --help: name, bool marker, type word,
// and the usage (with pflag's "(default X)" at its end).
var helpLineRE = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)(\[=true\|false\])?(?: (int|int64|uint|uint64|string|strings|duration|float|float64|level|stringArray))?\s+(.*)$`)

var defaultRE = regexp.MustCompile(`^(.*?)\s*\(default (.*)\)$`)

// flagsReference renders docs/flags.md from `pd-sidecar --help`: one row per
// flag with its type, default and meaning, so the reference cannot drift
// from the binary.
func flagsReference(t *testing.T) string {
	t.Helper()
	var usage bytes.Buffer
	_, err := parseFlags([]string{"--help"}, &usage)
	require.ErrorIs(t, err, errHelp)
	var b strings.Builder
	b.WriteString("# pd-sidecar flags\n\n")
	b.WriteString("Generated from `pd-sidecar --help` by `make docs` (a test fails while this file is out of date).\n")
	b.WriteString("Every flag is also a key of `--configuration`/`--configuration-file` and of the Helm chart's\n")
	b.WriteString("`sidecar.flags`. Precedence: command line > configuration file > environment variable > default.\n\n")
	b.WriteString("| flag | type | default | meaning |\n|---|---|---|---|\n")
	n := 0
	for _, line := range strings.Split(usage.String(), "\n") {
		m := helpLineRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		typ, text, def := m[3], strings.TrimSpace(m[4]), ""
		if typ == "" {
			typ = "bool"
		}
		if d := defaultRE.FindStringSubmatch(text); d != nil {
			text, def = d[1], strings.Trim(d[2], `"`)
		}
		if def == "" && typ == "bool" {
			def = "false"
		}
		if def == "" {
			def = "—"
		} else {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s | %s |\n", m[1], typ, def, strings.ReplaceAll(text, "|", `\|`))
		n++
	}
	require.Greater(t, n, 50, "flags read from --help")
	return b.String()
}

// TestFlagsReferenceIsCurrent keeps docs/flags.md equal to what the binary
// says; UPDATE_DOCS=1 (make docs) rewrites it.
func TestFlagsReferenceIsCurrent(t *testing.T) {
	want := flagsReference(t)
	if os.Getenv("UPDATE_DOCS") != "" {
		require.NoError(t, os.WriteFile(flagsDoc, []byte(want), 0o644))
	}
	have, err := os.ReadFile(flagsDoc)
	require.NoError(t, err)
	assert.Equal(t, want, string(have), "docs/flags.md is out of date: run make docs")
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	assert.Contains(t, string(readme), "docs/flags.md", "the README links the flag reference")
}
