//go:build !linux

package proxy

import "net"

// idleQuiet: without a non-blocking peek, a pooled connection is taken as
// fit (the lane, which needs one, runs on Linux only).
func idleQuiet(net.Conn) bool { return true }

func fdQuiet(int) bool { return true }

// fdClosed: without a non-blocking peek, a client's half-close is seen by
// its connWatch only.
func fdClosed(int) bool { return false }
