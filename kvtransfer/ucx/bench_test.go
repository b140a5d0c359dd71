//go:build ucx

package ucx_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/kvtest"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/ucx"
)

// go test -tags ucx -run '^$' -bench . -benchtime 20x ./kvtransfer/ucx/
// (UCX_TLS selects the UCX transports; unset: UCX's choice.)

func benchPull(b *testing.B, blocks int) {
	tr, err := ucx.New()
	require.NoError(b, err)
	e := kvtest.NewEnv(b, tr, kvtest.Options{Addr: "127.0.0.1:0", BlockBytes: 256 << 10, NumBlocks: blocks,
		Puller: kvtransfer.PullerConfig{Streams: 4, SkipChecksums: true}})
	e.BenchPull(b, blocks, true)
}

// BenchmarkPullUCX64MiB pulls 64 MiB in 256 KiB blocks.
func BenchmarkPullUCX64MiB(b *testing.B) { benchPull(b, 256) }

// BenchmarkPullUCXSmall is the latency of a one-block pull.
func BenchmarkPullUCXSmall(b *testing.B) { benchPull(b, 1) }

// BenchmarkProbeGets is the binding's cost per get: 16 MiB of the agent's
// UCX-allocated probe region read into one buffer per block size, as
// ucx_perftest reads (compare with `ucx_perftest -t ucp_get -s SIZE`, or run
// make bench-kv for both side by side).
func BenchmarkProbeGets(b *testing.B) {
	for _, bs := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("block=%dKiB", bs>>10), func(b *testing.B) {
			tr, err := ucx.New()
			require.NoError(b, err)
			e := kvtest.NewEnv(b, tr, kvtest.Options{Addr: "127.0.0.1:0", BlockBytes: 4096, NumBlocks: 1})
			c, err := e.Puller.Conn(context.Background(), e.Listener.Addr())
			require.NoError(b, err)
			probe := c.(interface {
				ProbeUCXMemory(context.Context, [][]byte) error
			}).ProbeUCXMemory
			buf := make([]byte, bs)
			dst := make([][]byte, (16<<20)/bs)
			for i := range dst {
				dst[i] = buf
			}
			require.NoError(b, probe(context.Background(), dst))
			b.SetBytes(16 << 20)
			b.ResetTimer()
			for range b.N {
				if err := probe(context.Background(), dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
