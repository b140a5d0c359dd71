//go:build !linux

package upstream

import "net"

// idleQuiet: without a non-blocking peek, a pooled connection is taken as
// fit (the lane, which needs one, runs on Linux only).
func idleQuiet(net.Conn) bool { return true }

// FdQuiet: without a non-blocking peek, a pooled connection is taken as
// fit.
func FdQuiet(int) bool { return true }
