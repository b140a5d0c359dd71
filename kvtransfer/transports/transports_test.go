package transports_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/nixl"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/transports"
)

func TestNames(t *testing.T) {
	tr, err := transports.New("tcp")
	require.NoError(t, err)
	assert.Equal(t, "tcp", tr.Name())
	_, err = transports.New("carrier-pigeon")
	require.ErrorIs(t, err, kvtransfer.ErrUnsupported)
}

func TestNIXLWithoutLibraryIsOneStartupError(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libnixl_capi.so")
	tr, err := transports.NewWith("nixl", transports.Options{NIXLLibrary: lib})
	require.ErrorIs(t, err, kvtransfer.ErrUnsupported)
	require.ErrorIs(t, err, nixl.ErrLibraryMissing)
	assert.Nil(t, tr, "no typed-nil transport")
	assert.Contains(t, err.Error(), "--kv-transport nixl")
	assert.Contains(t, err.Error(), lib)
	assert.Contains(t, err.Error(), "NIXL_CAPI_LIB")
}
