//go:build cgo

package nixl_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/kvtest"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/nixl"
)

func TestMissingLibraryIsOneClearError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libnixl_capi.so")
	_, err := nixl.New(nixl.Config{Library: path})
	require.Error(t, err)
	assert.ErrorIs(t, err, nixl.ErrLibraryMissing)
	assert.ErrorIs(t, err, kvtransfer.ErrUnsupported)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), "NIXL_CAPI_LIB")
	assert.NotContains(t, err.Error(), "\n")
}

func TestMissingSymbolNamesIt(t *testing.T) {
	lib := buildFake(t, "-DFAKE_OMIT_POST")
	_, err := nixl.Open(lib)
	require.ErrorIs(t, err, nixl.ErrLibraryMissing)
	assert.ErrorIs(t, err, kvtransfer.ErrUnsupported)
	assert.Contains(t, err.Error(), "nixl_capi_post_xfer_req")
	assert.Contains(t, err.Error(), lib)
	assert.Contains(t, err.Error(), "NIXL_CAPI_LIB")
}

// The status names are those of NIXL's wrapper.h (-6 is NOT_FOUND there).
func TestStatusNames(t *testing.T) {
	for st, name := range map[nixl.Status]string{
		nixl.StatusSuccess: "NIXL_CAPI_SUCCESS", nixl.StatusInProgress: "NIXL_CAPI_IN_PROG",
		nixl.StatusInvalidParam: "NIXL_CAPI_ERROR_INVALID_PARAM", nixl.StatusBackend: "NIXL_CAPI_ERROR_BACKEND",
		nixl.StatusInvalidState: "NIXL_CAPI_ERROR_INVALID_STATE", nixl.StatusException: "NIXL_CAPI_ERROR_EXCEPTION",
		nixl.StatusNoTelemetry: "NIXL_CAPI_ERROR_NO_TELEMETRY", nixl.StatusNotFound: "NIXL_CAPI_ERROR_NOT_FOUND",
		2: "nixl_capi_status_t(2)",
	} {
		assert.Equal(t, name, st.String(), "%d", int(st))
	}
	err := &nixl.CallError{Func: "nixl_capi_create_xfer_req", Status: nixl.StatusNotFound}
	assert.Equal(t, "nixl_capi_create_xfer_req: NIXL_CAPI_ERROR_NOT_FOUND (-6)", err.Error())
	assert.ErrorIs(t, err, nixl.ErrCall)
}

func TestStubBuildIsRefused(t *testing.T) {
	_, err := nixl.Open(buildFake(t, "-DFAKE_STUB"))
	require.ErrorIs(t, err, nixl.ErrLibraryMissing)
	assert.Contains(t, err.Error(), "stub")
}

// fakeLog is the fake library's call log, one line per call.
type fakeLog string

func (l fakeLog) lines(prefix string) []string {
	var out []string
	for _, s := range strings.Split(string(l), "\n") {
		if strings.HasPrefix(s, prefix) {
			out = append(out, s)
		}
	}
	return out
}

// field returns key's value in a log line ("key=value").
func field(line, key string) string {
	m := regexp.MustCompile(`(?:^| )` + regexp.QuoteMeta(key) + `=(\S*)`).FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	return m[1]
}

func addr(b []byte) string { return fmt.Sprintf("%#x", uintptr(unsafe.Pointer(&b[0]))) }

func TestPullMarshalsDescriptorsMetadataAndOperation(t *testing.T) {
	lib := buildFake(t)
	logPath := filepath.Join(t.TempDir(), "calls.log")
	t.Setenv("FAKE_NIXL_LOG", logPath)
	tr, err := nixl.New(nixl.Config{Library: lib, AgentPrefix: "px"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	e := kvtest.NewEnv(t, tr, kvtest.Options{Addr: "127.0.0.1:0", BlockBytes: 4096, NumBlocks: 16,
		Puller: kvtransfer.PullerConfig{Streams: 1}})

	ids := []int{7, 3, 12}
	src := e.Hold(t, ids, false)
	dst := e.Dst(t, 4, 3)
	_, err = e.Puller.Pull(context.Background(), src, dst)
	require.NoError(t, err)
	e.AssertSame(t, src, dst)
	e.AssertReleased(t, src.RequestID, kvtransfer.ReasonCompleted)

	raw, err := os.ReadFile(logPath)
	require.NoError(t, err)
	log := fakeLog(raw)

	// Two agents (the listener's and the pullers'), each with a UCX backend.
	agents := log.lines("create_agent ")
	require.Len(t, agents, 2, string(raw))
	agentName, pullerName := field(agents[0], "name"), field(agents[1], "name")
	assert.True(t, strings.HasPrefix(agentName, "px-agent-"), agentName)
	assert.True(t, strings.HasPrefix(pullerName, "px-puller-"), pullerName)
	for _, l := range log.lines("create_backend ") {
		assert.Equal(t, "UCX", field(l, "plugin"))
	}
	assert.Len(t, log.lines("create_backend "), 2)

	// The agent registers its whole region as DRAM on device 0, then the
	// 4 MiB filler region it serves to kv-probe.
	remote := e.Region.Mem()
	reg := log.lines("register_mem agent=" + agentName + " ")
	require.Len(t, reg, 2)
	assert.Equal(t, fmt.Sprint(4<<20), field(reg[1], "len"))
	assert.Equal(t, "0", field(reg[0], "mem"))
	assert.Equal(t, addr(remote), field(reg[0], "addr"))
	assert.Equal(t, fmt.Sprint(len(remote)), field(reg[0], "len"))
	assert.Equal(t, "0", field(reg[0], "dev"))

	// Metadata bytes (binary: NUL and 0xff) arrive unchanged, once.
	got, loaded := log.lines("get_local_md "), log.lines("load_remote_md ")
	require.Len(t, got, 1)
	require.Len(t, loaded, 1)
	assert.Equal(t, field(got[0], "md"), field(loaded[0], "md"))
	assert.Equal(t, pullerName, field(loaded[0], "agent"))
	assert.Equal(t, agentName, field(loaded[0], "name"))

	// One READ of three pairs: local = the destination blocks, remote =
	// region base + id*block, in order; the destination is registered
	// for the read and deregistered after.
	req := log.lines("create_xfer_req agent=")
	require.Len(t, req, 1)
	assert.Equal(t, pullerName, field(req[0], "agent"))
	assert.Equal(t, "0", field(req[0], "op"), "NIXL_CAPI_XFER_OP_READ")
	assert.Equal(t, agentName, field(req[0], "remote"))
	assert.Equal(t, "3", field(req[0], "n"))
	assert.Equal(t, "0", field(req[0], "local_mem"))
	assert.Equal(t, "0", field(req[0], "remote_mem"))
	descs := log.lines("xfer_desc ")
	require.Len(t, descs, 3)
	for i, id := range ids {
		want := fmt.Sprintf("%s/4096/0", addr(dst[i]))
		assert.Equal(t, want, field(descs[i], "local"), "desc %d", i)
		want = fmt.Sprintf("%#x/4096/0", uintptr(unsafe.Pointer(&remote[0]))+uintptr(id*4096))
		assert.Equal(t, want, field(descs[i], "remote"), "desc %d", i)
	}
	assert.Len(t, log.lines("register_mem agent="+pullerName+" "), 3)
	assert.Len(t, log.lines("deregister_mem agent="+pullerName+" "), 3)

	// Posted, polled, released and freed: nothing leaks.
	assert.Len(t, log.lines("post_xfer_req "), 1)
	rel := log.lines("release_xfer_req ")
	require.Len(t, rel, 1)
	assert.Equal(t, "1", field(rel[0], "done"))
	assert.Len(t, log.lines("destroy_xfer_req"), 1)
}

// Agents are created with a progress thread that sleeps in poll between
// events (NIXL's default delay, 0, spins a core per agent).
func TestAgentsProgressThreadPollsWithADelay(t *testing.T) {
	lib := buildFake(t)
	for _, tc := range []struct {
		delay time.Duration
		want  string
	}{{0, "1000"}, {5 * time.Millisecond, "5000"}} {
		logPath := filepath.Join(t.TempDir(), "calls.log")
		t.Setenv("FAKE_NIXL_LOG", logPath)
		tr, err := nixl.New(nixl.Config{Library: lib, ProgressDelay: tc.delay})
		require.NoError(t, err)
		e := kvtest.NewEnv(t, tr, kvtest.Options{Addr: "127.0.0.1:0"})
		src := e.Hold(t, []int{1}, false)
		_, err = e.Puller.Pull(context.Background(), src, e.Dst(t, 0, 1))
		require.NoError(t, err)
		require.NoError(t, tr.Close())

		raw, err := os.ReadFile(logPath)
		require.NoError(t, err)
		created := fakeLog(raw).lines("create_configured_agent ")
		require.Len(t, created, 2, "the listener's agent and the pullers'")
		for _, l := range created {
			assert.Equal(t, "1", field(l, "prog_thread"), l)
			assert.Equal(t, tc.want, field(l, "pthr_delay_us"), l)
			assert.Equal(t, "0", field(l, "listen_thread"), l)
			assert.Equal(t, "0", field(l, "sync"), l)
			assert.Equal(t, "1", field(l, "workers"), l)
			assert.Equal(t, "100000", field(l, "lthr_delay_us"), l)
			assert.Equal(t, "0", field(l, "telemetry"), l)
		}
	}
}

// A library without nixl_capi_create_configured_agent (NIXL before 0.6.1)
// still works, with nixl_capi_create_agent.
func TestLibraryWithoutConfiguredAgent(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "calls.log")
	t.Setenv("FAKE_NIXL_LOG", logPath)
	lib, err := nixl.Open(buildFake(t, "-DFAKE_OMIT_CONFIGURED"))
	require.NoError(t, err)
	a, err := lib.NewAgent("old", "UCX")
	require.NoError(t, err)
	a.Close()
	raw, err := os.ReadFile(logPath)
	require.NoError(t, err)
	assert.Len(t, fakeLog(raw).lines("create_agent name=old"), 1, string(raw))
	assert.Empty(t, fakeLog(raw).lines("create_configured_agent "))
}

func TestRegisterLocalSkipsPerReadRegistration(t *testing.T) {
	lib := buildFake(t)
	logPath := filepath.Join(t.TempDir(), "calls.log")
	t.Setenv("FAKE_NIXL_LOG", logPath)
	tr, err := nixl.New(nixl.Config{Library: lib})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	e := kvtest.NewEnv(t, tr, kvtest.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, tr.RegisterLocal(e.Local))

	src := e.Hold(t, []int{1, 2, 3, 4}, false)
	dst := e.Dst(t, 0, 4)
	_, err = e.Puller.Pull(context.Background(), src, dst)
	require.NoError(t, err)
	e.AssertSame(t, src, dst)

	raw, err := os.ReadFile(logPath)
	require.NoError(t, err)
	log := fakeLog(raw)
	// The listener's region, its probe region and the local region: no
	// per-read registration.
	assert.Len(t, log.lines("register_mem "), 3, string(raw))
	assert.Empty(t, log.lines("deregister_mem "))

	// Deregistered (before an unmap), the region is registered per read
	// again; a second deregistration is refused.
	require.NoError(t, tr.DeregisterLocal(e.Local))
	require.ErrorIs(t, tr.DeregisterLocal(e.Local), kvtransfer.ErrKVProtocol)
	src = e.Hold(t, []int{5, 6}, false)
	dst = e.Dst(t, 0, 2)
	_, err = e.Puller.Pull(context.Background(), src, dst)
	require.NoError(t, err)
	e.AssertSame(t, src, dst)
	raw, err = os.ReadFile(logPath)
	require.NoError(t, err)
	log = fakeLog(raw)
	dereg := log.lines("deregister_mem ")
	require.Len(t, dereg, 3, "the local region, then the read's two blocks: %s", raw)
	assert.Equal(t, fmt.Sprint(len(e.Local.Mem())), field(dereg[0], "len"))
	assert.Len(t, log.lines("register_mem "), 5, "the read's two blocks registered")
}

func TestAgentBindingRoundTrip(t *testing.T) {
	md := testAgentRoundTrip(t, buildFake(t))
	assert.Equal(t, append([]byte("FAKEMD\x00a"), 0xff), md)
}

// testAgentRoundTrip runs the binding's agent calls against the library at
// path: what real NIXL and the fake must both do. It returns agent a's
// metadata.
func testAgentRoundTrip(t *testing.T, path string) []byte {
	lib, err := nixl.Open(path)
	require.NoError(t, err)
	a, err := lib.NewAgent("a", "UCX")
	require.NoError(t, err)
	defer a.Close()
	b, err := lib.NewAgent("b", "UCX")
	require.NoError(t, err)
	defer b.Close()

	// The agents hold only the buffers' addresses, so the buffers are
	// mapped outside Go's heap and stacks: a small Go buffer may live on
	// the goroutine's stack, which moves when it grows (real NIXL then
	// read zeros from the stale address).
	src := mapped(t, 16)
	copy(src, "0123456789abcdef")
	dst := mapped(t, 8)
	srcDesc := nixl.Desc{Addr: uintptr(unsafe.Pointer(&src[0])), Len: len(src)}
	dstDesc := nixl.Desc{Addr: uintptr(unsafe.Pointer(&dst[0])), Len: len(dst)}
	require.NoError(t, a.Register(nixl.MemDRAM, []nixl.Desc{srcDesc}))
	require.NoError(t, b.Register(nixl.MemDRAM, []nixl.Desc{dstDesc}))

	md, err := a.LocalMD()
	require.NoError(t, err)
	require.NotEmpty(t, md)

	// Before the metadata is loaded the remote is unknown.
	remote := []nixl.Desc{{Addr: srcDesc.Addr + 4, Len: 8}}
	err = b.Read(context.Background(), nixl.MemDRAM, nixl.MemDRAM, []nixl.Desc{dstDesc}, remote, "a")
	var ce *nixl.CallError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "nixl_capi_create_xfer_req", ce.Func)
	// NIXL 0.7.1 says BACKEND for every failure, later versions NOT_FOUND.
	assert.Contains(t, []nixl.Status{nixl.StatusBackend, nixl.StatusNotFound}, ce.Status)
	assert.ErrorIs(t, err, nixl.ErrCall)

	name, err := b.LoadRemoteMD(md)
	require.NoError(t, err)
	assert.Equal(t, "a", name)
	require.NoError(t, b.Read(context.Background(), nixl.MemDRAM, nixl.MemDRAM, []nixl.Desc{dstDesc}, remote, "a"))
	assert.Equal(t, "456789ab", string(dst))

	// Lengths must pair up; unregistered remote memory is refused.
	_, err = b.Transfer(nixl.OpRead, nixl.MemDRAM, nixl.MemDRAM, []nixl.Desc{dstDesc}, nil, "a")
	require.ErrorIs(t, err, nixl.ErrCall)
	err = b.Read(context.Background(), nixl.MemDRAM, nixl.MemDRAM, []nixl.Desc{dstDesc}, []nixl.Desc{{Addr: srcDesc.Addr + 12, Len: 8}}, "a")
	require.ErrorAs(t, err, &ce)

	// A gone agent fails the transfer.
	require.NoError(t, b.InvalidateRemoteMD("a"))
	_, err = b.LoadRemoteMD(md)
	require.NoError(t, err)
	a.Close()
	err = b.Read(context.Background(), nixl.MemDRAM, nixl.MemDRAM, []nixl.Desc{dstDesc}, remote, "a")
	require.ErrorAs(t, err, &ce)
	return md
}

// mapped returns n bytes of anonymous memory, unmapped at the test's end.
func mapped(t *testing.T, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(b) })
	return b
}

// twoAgents returns agents a (serving src) and b (reading into dst), b
// with a's metadata loaded, and the descriptors of src and dst.
func twoAgents(t *testing.T, path string, n int) (a, b *nixl.Agent, src, dst []byte, sd, dd nixl.Desc) {
	t.Helper()
	lib, err := nixl.Open(path)
	require.NoError(t, err)
	a, err = lib.NewAgent("src", "UCX")
	require.NoError(t, err)
	t.Cleanup(a.Close)
	b, err = lib.NewAgent("dst", "UCX")
	require.NoError(t, err)
	t.Cleanup(b.Close)
	src, dst = mapped(t, n), mapped(t, n)
	for i := range src {
		src[i] = byte(i%251) + 1
	}
	sd = nixl.Desc{Addr: uintptr(unsafe.Pointer(&src[0])), Len: n}
	dd = nixl.Desc{Addr: uintptr(unsafe.Pointer(&dst[0])), Len: n}
	require.NoError(t, a.Register(nixl.MemDRAM, []nixl.Desc{sd}))
	require.NoError(t, b.Register(nixl.MemDRAM, []nixl.Desc{dd}))
	md, err := a.LocalMD()
	require.NoError(t, err)
	_, err = b.LoadRemoteMD(md)
	require.NoError(t, err)
	return a, b, src, dst, sd, dd
}

// A cancelled read lets the running transfer end before releasing it: the
// destination must not be written after Read returns (real NIXL's release
// does not stop the data).
func TestCancelledReadReleasesOnlyAfterTheTransferEnds(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "calls.log")
	t.Setenv("FAKE_NIXL_LOG", logPath)
	_, b, src, dst, sd, dd := twoAgents(t, buildFake(t), 4096)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := b.Read(ctx, nixl.MemDRAM, nixl.MemDRAM, []nixl.Desc{dd}, []nixl.Desc{sd}, "src")
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, src, dst)
	raw, err := os.ReadFile(logPath)
	require.NoError(t, err)
	rel := fakeLog(raw).lines("release_xfer_req ")
	require.Len(t, rel, 1)
	assert.Equal(t, "1", field(rel[0], "done"), "released while still running")
}

// A transfer that never ends is released after the drain time, and the
// error says its memory may still be written.
func TestStuckTransferIsReleasedAfterTheDrainTime(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "calls.log")
	t.Setenv("FAKE_NIXL_LOG", logPath)
	t.Setenv("FAKE_NIXL_STUCK", "1")
	_, b, _, _, sd, dd := twoAgents(t, buildFake(t), 4096)
	nixl.SetDrainTimeout(b, 50*time.Millisecond)
	// Timed from before the deadline's clock starts: both 20 ms and 50 ms
	// are lower bounds counted from events after start, on any machine.
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := b.Read(ctx, nixl.MemDRAM, nixl.MemDRAM, []nixl.Desc{dd}, []nixl.Desc{sd}, "src")
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, nixl.ErrCall)
	assert.Contains(t, err.Error(), "may still be written")
	assert.GreaterOrEqual(t, took, 70*time.Millisecond, "the read's 20 ms, then the 50 ms drain")
	raw, rerr := os.ReadFile(logPath)
	require.NoError(t, rerr)
	rel := fakeLog(raw).lines("release_xfer_req ")
	require.Len(t, rel, 1)
	assert.Equal(t, "0", field(rel[0], "done"))
	assert.Len(t, fakeLog(raw).lines("destroy_xfer_req"), 1)
}

func TestConformanceFakeNIXL(t *testing.T) {
	lib := buildFake(t)
	kvtest.RunConformance(t, "127.0.0.1:0", func(t testing.TB) kvtransfer.Transport {
		tr, err := nixl.New(nixl.Config{Library: lib})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	})
}
