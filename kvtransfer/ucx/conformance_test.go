//go:build ucx

package ucx_test

import (
	"bytes"
	"cmp"
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
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

// TestLanesFollowUCXTLS checks, under the UCX_TLS of the run (make test-ucx
// runs the package once per setting), that the reads ride the transports
// that setting names: an endpoint made from the worker address can use
// shared memory, where the former client-server connection could not.
func TestLanesFollowUCXTLS(t *testing.T) {
	tr, err := ucx.New()
	require.NoError(t, err)
	e := kvtest.NewEnv(t, tr, kvtest.Options{Addr: "127.0.0.1:0", BlockBytes: 4096, NumBlocks: 4})
	c, err := e.Puller.Conn(context.Background(), e.Listener.Addr())
	require.NoError(t, err)
	lr, ok := c.(interface {
		Lanes(context.Context) (string, error)
		PeerFailureDetection() bool
	})
	require.True(t, ok, "the ucx connection describes its lanes")
	lanes, err := lr.Lanes(context.Background())
	require.NoError(t, err)
	t.Logf("UCX_TLS=%q:\n%s", os.Getenv("UCX_TLS"), lanes)
	require.Contains(t, lanes, "lane[0]")
	// On one host, a setting that allows sysv or posix shared memory
	// carries the gets over it (never cma: see localTLS), tcp or not beside
	// it, on an endpoint the control connection watches; otherwise tcp
	// does, watching the peer itself.
	tls := os.Getenv("UCX_TLS")
	shm := ucx.LocalTLS(cmp.Or(tls, "all")) != ""
	if shm {
		assert.Regexp(t, `sysv/|posix/`, lanes)
		assert.NotContains(t, lanes, "tcp/", "UCX_TLS=%q: shared memory is preferred on one host", tls)
		assert.NotContains(t, lanes, "cma/", "UCX_TLS=%q: no cma without peer failure handling", tls)
		assert.False(t, lr.PeerFailureDetection(), "sysv and posix have no peer failure detection: the control connection watches")
	} else {
		assert.Contains(t, lanes, "tcp/")
		assert.True(t, lr.PeerFailureDetection(), "tcp detects a peer's failure")
	}
	// Both probe regions read back filler over these lanes.
	mark := bytes.Repeat([]byte{0xa5}, 64<<10)
	for _, probe := range []func(context.Context, [][]byte) error{
		c.(kvtransfer.Prober).Probe,
		c.(interface {
			ProbeUCXMemory(context.Context, [][]byte) error
		}).ProbeUCXMemory,
	} {
		dst := [][]byte{bytes.Clone(mark), bytes.Clone(mark)}
		require.NoError(t, probe(context.Background(), dst))
		for _, d := range dst {
			assert.NotEqual(t, mark, d)
			assert.Equal(t, byte(1), d[0], "the filler starts at byte(0*7+1)")
		}
	}
}
