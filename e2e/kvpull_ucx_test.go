//go:build ucx

package e2e

import "testing"

// TestKVPullUCX runs the sidecar-pull e2e over the ucx transport (binaries
// built with -tags ucx; UCX picks its transports from UCX_TLS, tcp and
// shared memory on loopback).
func TestKVPullUCX(t *testing.T) { testKVPull(t, "ucx") }
