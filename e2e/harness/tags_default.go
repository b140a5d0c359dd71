//go:build !ucx

package harness

// buildTags are passed to go build for the binaries under test.
const buildTags = ""
