//go:build cgo

package nixl_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/kvtest"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/nixl"
)

// The tests named RealNIXL run the binding against the real library:
// NIXL_CAPI_LIB names libnixl_capi.so, NIXL finds its UCX plugin through
// NIXL_PLUGIN_DIR, and the loader finds NIXL's and UCX's libraries through
// LD_LIBRARY_PATH. make test-nixl NIXL_PREFIX=... sets all three from an
// install of scripts/build-nixl.sh.

// realLibrary returns NIXL_CAPI_LIB, or skips the test when it is unset. A
// path that is set but unusable fails the test.
func realLibrary(t testing.TB) string {
	t.Helper()
	lib := os.Getenv("NIXL_CAPI_LIB")
	if lib == "" {
		t.Skip("real NIXL not given: NIXL_CAPI_LIB is unset (make test-nixl NIXL_PREFIX=... runs this)")
	}
	return lib
}

func TestAgentRoundTripRealNIXL(t *testing.T) {
	testAgentRoundTrip(t, realLibrary(t))
}

func TestConformanceRealNIXL(t *testing.T) {
	lib := realLibrary(t)
	kvtest.RunConformance(t, "127.0.0.1:0", func(t testing.TB) kvtransfer.Transport {
		tr, err := nixl.New(nixl.Config{Library: lib})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	})
}
