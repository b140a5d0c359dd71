//go:build !linux

package clientconn

// fdClosed: without a non-blocking peek, a client's half-close is seen by
// its Watch only.
func fdClosed(int) bool { return false }
