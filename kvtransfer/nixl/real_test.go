//go:build cgo

package nixl_test

import (
	"bytes"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

// An idle agent uses next to no CPU. NIXL's default progress-thread delay
// (what nixl_capi_create_agent gives) spins that thread, a whole core per
// agent. And before NIXL 0.10.0 an agent of a build without etcd read an
// uninitialised flag (useEtcd) and, when the heap held garbage there,
// started its metadata thread, which spins too: agents created after
// others had come and gone did (scripts/build-nixl.sh patches that), so
// this test lets a few come and go first.
func TestIdleAgentSleepsRealNIXL(t *testing.T) {
	lib, err := nixl.Open(realLibrary(t))
	require.NoError(t, err)
	testAgentRoundTrip(t, realLibrary(t))
	a, err := lib.NewAgent("idle", "UCX")
	require.NoError(t, err)
	defer a.Close()
	const idle = time.Second
	before := cpuTime(t)
	time.Sleep(idle)
	used := cpuTime(t) - before
	t.Logf("an idle agent: %v of CPU in %v", used, idle)
	assert.Less(t, used, idle/4, "the progress thread spins")
}

// cpuTime is the CPU time this process has used.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Releasing a running READ does not stop it in NIXL 0.7.1 (the data kept
// landing after nixl_capi_release_xfer_req returned success): Release lets
// it end first, so nothing writes the destination after Release returns.
func TestReleaseWaitsForARunningTransferRealNIXL(t *testing.T) {
	const n, block = 64 << 20, 256 << 10
	_, b, src, dst, sd, dd := twoAgents(t, realLibrary(t), n)
	var local, remote []nixl.Desc
	for off := 0; off < n; off += block {
		local = append(local, nixl.Desc{Addr: dd.Addr + uintptr(off), Len: block})
		remote = append(remote, nixl.Desc{Addr: sd.Addr + uintptr(off), Len: block})
	}
	x, err := b.Transfer(nixl.OpRead, nixl.MemDRAM, nixl.MemDRAM, local, remote, "src")
	require.NoError(t, err)
	st, err := x.Status()
	require.NoError(t, err)
	require.NoError(t, x.Release())
	atRelease := bytes.Clone(dst)
	time.Sleep(200 * time.Millisecond)
	t.Logf("status when released: %v", st)
	assert.True(t, bytes.Equal(atRelease, dst), "the destination changed after Release returned")
	assert.True(t, bytes.Equal(src, dst), "the transfer ran to its end")
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

// go test -run '^$' -bench RealNIXL -benchtime 20x ./kvtransfer/nixl/ (with
// the environment of make test-nixl; UCX_TLS selects UCX's transports).

// benchPullReal pulls blocks of 256 KiB over the real library, four
// streams, checksums skipped (as kvtransfer's and ucx's pull benchmarks);
// registered: the destination region registered once (RegisterLocal)
// instead of per read.
func benchPullReal(b *testing.B, blocks int, registered bool) {
	tr, err := nixl.New(nixl.Config{Library: realLibrary(b)})
	require.NoError(b, err)
	b.Cleanup(func() { _ = tr.Close() })
	e := kvtest.NewEnv(b, tr, kvtest.Options{Addr: "127.0.0.1:0", BlockBytes: 256 << 10, NumBlocks: blocks,
		Puller: kvtransfer.PullerConfig{Streams: 4, SkipChecksums: true}})
	if registered {
		require.NoError(b, tr.RegisterLocal(e.Local))
	}
	e.BenchPull(b, blocks, true)
}

// BenchmarkPullRealNIXL64MiB pulls 64 MiB in 256 KiB blocks.
func BenchmarkPullRealNIXL64MiB(b *testing.B) {
	b.Run("register-per-read", func(b *testing.B) { benchPullReal(b, 256, false) })
	b.Run("RegisterLocal", func(b *testing.B) { benchPullReal(b, 256, true) })
}

// BenchmarkPullRealNIXLSmall is the latency of a one-block pull.
func BenchmarkPullRealNIXLSmall(b *testing.B) {
	b.Run("register-per-read", func(b *testing.B) { benchPullReal(b, 1, false) })
	b.Run("RegisterLocal", func(b *testing.B) { benchPullReal(b, 1, true) })
}
