//go:build ucx

package harness

// buildTags are passed to go build for the binaries under test: a test
// binary built with -tags ucx tests binaries built with it.
const buildTags = "ucx"
