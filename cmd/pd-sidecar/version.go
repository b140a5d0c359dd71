package main

import (
	"fmt"
	"runtime/debug"
)

// buildInfo is what the binary knows of its own build: the module version
// ("(devel)" for a build from a checkout), the VCS revision and whether the
// tree had local changes (when built from a git checkout), and the Go
// version. It is read from the binary itself (runtime/debug), so every
// build carries it without flags.
type buildInfo struct {
	version, revision, goVersion string
	modified                     bool
}

func readBuildInfo() buildInfo {
	b := buildInfo{version: "(devel)", revision: "unknown", goVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	b.goVersion = bi.GoVersion
	if v := bi.Main.Version; v != "" {
		b.version = v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.revision = s.Value
		case "vcs.modified":
			b.modified = s.Value == "true"
		}
	}
	return b
}

// String is the line `pd-sidecar --version` prints.
func (b buildInfo) String() string {
	rev := b.revision
	if b.modified {
		rev += " (modified)"
	}
	return fmt.Sprintf("pd-sidecar %s, commit %s, built with %s", b.version, rev, b.goVersion)
}

// usageHead starts `pd-sidecar --help`: the command lines, then the flags.
const usageHead = `pd-sidecar: the P/D routing sidecar in front of the decode engine.

Usage:
  pd-sidecar [flags]                      serve (the flags below)
  pd-sidecar status [--url URL] [--json]  is P/D disaggregation really operating? (reads /debug/pd)
  pd-sidecar kv-probe --peer HOST:PORT    latency and bandwidth to a kvtransfer agent
  pd-sidecar --version                    version, commit and Go version of this build

Each command takes --help. Flags:
`
