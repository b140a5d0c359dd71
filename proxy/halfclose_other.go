//go:build !linux

package proxy

// fdClosed: without a non-blocking peek, a client's half-close is seen by
// its connWatch only.
func fdClosed(int) bool { return false }
