package e2e

import (
	"os"
	"testing"
)

// TestKVPullNIXL runs the sidecar-pull e2e over the nixl transport against
// the real NIXL library: engine-sim and pd-sidecar inherit NIXL_CAPI_LIB,
// NIXL_PLUGIN_DIR and LD_LIBRARY_PATH from the test (make test-nixl
// NIXL_PREFIX=... sets them from an install of scripts/build-nixl.sh).
func TestKVPullNIXL(t *testing.T) {
	if os.Getenv("NIXL_CAPI_LIB") == "" {
		t.Skip("real NIXL not given: NIXL_CAPI_LIB is unset (make test-nixl NIXL_PREFIX=... runs this)")
	}
	testKVPull(t, "nixl")
}
