package kvtransfer_test

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/kvtest"
)

// The pull benchmarks move 64 MiB in 256 KiB blocks over loopback; compare
// their MB/s with BenchmarkRawLoopbackTCP64MiB, a plain one-connection copy
// of the same bytes measured in the same run:
//
//	go test -run '^$' -bench . -benchtime 20x ./kvtransfer/

const (
	benchBlock  = 256 << 10
	benchBlocks = 256 // 64 MiB
)

func benchPull(b *testing.B, tr kvtransfer.Transport, addr string, blocks int, cfg kvtransfer.PullerConfig) {
	e := kvtest.NewEnv(b, tr, kvtest.Options{Addr: addr, BlockBytes: benchBlock, NumBlocks: blocks, Puller: cfg})
	e.BenchPull(b, blocks, cfg.SkipChecksums)
}

func BenchmarkPullTCP64MiB(b *testing.B) {
	for _, c := range []struct {
		name string
		cfg  kvtransfer.PullerConfig
	}{
		{"streams=1", kvtransfer.PullerConfig{Streams: 1, SkipChecksums: true}},
		{"streams=4", kvtransfer.PullerConfig{Streams: 4, SkipChecksums: true}},
		{"streams=4+crc64", kvtransfer.PullerConfig{Streams: 4}},
	} {
		b.Run(c.name, func(b *testing.B) {
			benchPull(b, kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{}), "127.0.0.1:0", benchBlocks, c.cfg)
		})
	}
}

// BenchmarkPullTCPSmall is the latency of a one-block (256 KiB) pull: open,
// read, complete.
func BenchmarkPullTCPSmall(b *testing.B) {
	benchPull(b, kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{}), "127.0.0.1:0", 1, kvtransfer.PullerConfig{SkipChecksums: true})
}

// BenchmarkRawLoopbackTCP64MiB copies 64 MiB over one loopback TCP
// connection — the same 64 MiB as a pull, written in 256 KiB pieces from
// distinct memory, read into a 64 MiB buffer: the ceiling.
func BenchmarkRawLoopbackTCP64MiB(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer l.Close()
	// 64 MiB of distinct source memory, as a pull reads from a region (a
	// single 256 KiB buffer sent 256 times would stay hot in the cache and
	// flatter the baseline).
	src := make([]byte, benchBlocks*benchBlock)
	for i := range src {
		src[i] = byte(i)
	}
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var one [1]byte
		for {
			if _, err := io.ReadFull(c, one[:]); err != nil {
				return
			}
			for k := range benchBlocks {
				if _, err := c.Write(src[k*benchBlock : (k+1)*benchBlock]); err != nil {
					return
				}
			}
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(b, err)
	defer c.Close()
	dst := make([]byte, benchBlocks*benchBlock)
	b.SetBytes(int64(len(dst)))
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write([]byte{1}); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, dst); err != nil {
			b.Fatal(err)
		}
	}
}
