//go:build ucx

package ucx_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/kvtest"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/ucx"
)

func TestConformanceUCX(t *testing.T) {
	kvtest.RunConformance(t, "127.0.0.1:0", func(t testing.TB) kvtransfer.Transport {
		tr, err := ucx.New()
		require.NoError(t, err)
		return tr
	})
}
