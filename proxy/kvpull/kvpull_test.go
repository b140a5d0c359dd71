package kvpull

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/sidecar"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

const (
	blockBytes = 4096
	label      = "prefiller-0"
	localAddr  = "127.0.0.1:8200"
)

// fakeEngine is the local engine's side of the lending protocol: it
// answers POST /kv/alloc with blocks of its host region (or with status,
// err or answer, when set) and records the calls it gets, which a pull
// makes one after the other.
type fakeEngine struct {
	path   string
	status int    // of /kv/alloc; 0: 200
	err    error  // of every call
	answer string // of /kv/alloc; "": two blocks of path
	calls  []string
}

func (e *fakeEngine) call(_ context.Context, path string, body []byte) ([]byte, int, error) {
	e.calls = append(e.calls, path+" "+string(body))
	switch {
	case e.err != nil:
		return nil, 0, e.err
	case path == "/kv/free":
		return nil, 200, nil
	case e.status != 0:
		return []byte("engine's own words"), e.status, nil
	case e.answer != "":
		return []byte(e.answer), 200, nil
	}
	return fmt.Appendf(nil, `{"alloc_id":"a1","block_ids":[2,3],"region":{"kind":"host","path":%q,"block_bytes":%d}}`, e.path, blockBytes), 200, nil
}

// request is a pull's request to e, its failed calls named as the
// engine's.
func (e *fakeEngine) request() Request {
	return Request{
		ID: "req-1", Label: label, Local: localAddr,
		Call: e.call,
		CallErr: func(err error) error {
			return &upstream.UpstreamError{Role: upstream.RoleEngine, Reason: "refused", Addr: localAddr, Err: err}
		},
		Log: func(zerolog.Level) *zerolog.Event { return nil },
	}
}

// prefiller is a prefiller's agent on a mem transport holding two blocks,
// and the handoff of its prefill answer naming them.
type prefiller struct {
	agent   *kvtransfer.Agent
	handoff connectors.Handoff
	blocks  [][]byte
}

func newPrefiller(t *testing.T, tr *kvtransfer.MemTransport, mutate func(*kvtransfer.Source)) *prefiller {
	t.Helper()
	reg, err := kvtransfer.NewMemRegion("prefill", 4, blockBytes)
	require.NoError(t, err)
	blocks, err := reg.Blocks([]int{0, 1})
	require.NoError(t, err)
	for i, b := range blocks {
		for j := range b {
			b[j] = byte(i + j)
		}
	}
	a := kvtransfer.NewAgent(kvtransfer.AgentConfig{EngineID: "prefill-engine"})
	t.Cleanup(a.Close)
	a.Register(reg)
	ln, err := tr.Listen(t.Context(), "", a)
	require.NoError(t, err)
	src, err := a.Hold(kvtransfer.Hold{RequestID: "req-1", Region: reg, BlockIDs: []int{0, 1}, NumTokens: 20,
		Checksums: []uint64{kvtransfer.Checksum(blocks[0]), kvtransfer.Checksum(blocks[1])}})
	require.NoError(t, err)
	src.Agent, src.Transport = ln.Addr(), tr.Name()
	if mutate != nil {
		mutate(&src)
	}
	raw, err := json.Marshal(src)
	require.NoError(t, err)
	return &prefiller{agent: a, handoff: connectors.Handoff{Params: raw}, blocks: blocks}
}

// TestPull: a pull borrows the local engine's blocks, fills them with the
// prefiller's, and names them in the decode leg's handoff; a failed one
// frees what it borrowed, or releases the remote hold when nothing was
// borrowed, and is counted by its reason.
func TestPull(t *testing.T) {
	for _, tc := range []struct {
		name    string
		engine  fakeEngine
		source  func(*kvtransfer.Source)
		handoff []byte // replaces the prefiller's
		is      error
		reason  string // "": the pull succeeds
		freed   bool
		held    int // the prefiller's blocks held after the pull
	}{
		{name: "pulled"},
		{name: "alloc refused", engine: fakeEngine{status: 503}, is: ErrAlloc, reason: metrics.KVPullAlloc},
		{name: "alloc unanswered", engine: fakeEngine{err: upstream.ErrBufferBudget}, is: upstream.ErrBufferBudget, reason: metrics.KVPullAlloc},
		{name: "alloc of other blocks", engine: fakeEngine{answer: `{"alloc_id":"a1","block_ids":[2]}`}, is: ErrAlloc, reason: metrics.KVPullAlloc},
		{name: "not held", source: func(s *kvtransfer.Source) { s.RequestID = "other" }, is: kvtransfer.ErrKVNotHeld, reason: metrics.KVPullNotHeld, freed: true, held: 2},
		{name: "other block size", source: func(s *kvtransfer.Source) { s.BlockBytes = 2 * blockBytes }, is: kvtransfer.ErrKVSize, reason: metrics.KVPullSize, freed: true, held: 2},
		{name: "no kv_source", handoff: []byte(`{"x":1}`), is: connectors.ErrInvalidKVParams, reason: metrics.KVPullOther, held: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := kvtransfer.NewMemTransport()
			pre := newPrefiller(t, tr, tc.source)
			h := pre.handoff
			if tc.handoff != nil {
				h.Params = tc.handoff
			}
			path := filepath.Join(t.TempDir(), "engine.kv")
			local, err := kvtransfer.CreateHostRegion(path, 4, blockBytes)
			require.NoError(t, err)
			t.Cleanup(func() { _ = local.Close() })
			e := tc.engine
			e.path = path

			puller, err := kvtransfer.NewPuller(tr, kvtransfer.PullerConfig{Deadline: 5 * time.Second})
			require.NoError(t, err)
			m := metrics.NewKVPull(prometheus.NewRegistry())
			k := New(Config{}, Deps{Conn: sidecar.New(), Puller: puller, Metrics: m, FreeTimeout: time.Second})

			out, err := k.Pull(t.Context(), e.request(), h)
			if tc.reason == "" {
				require.NoError(t, err)
				assert.JSONEq(t, `{"do_remote_prefill":true,"do_remote_decode":false,"kv_preloaded":{"alloc_id":"a1","block_ids":[2,3],"num_tokens":20}}`, string(out.Params))
				got, err := local.Blocks([]int{2, 3})
				require.NoError(t, err)
				for i := range got {
					assert.True(t, bytes.Equal(pre.blocks[i], got[i]), "block %d is the prefiller's", i)
				}
				assert.Equal(t, float64(2*blockBytes), testutil.ToFloat64(m.Bytes.WithLabelValues(label, "mem")))
				assert.Equal(t, 1, testutil.CollectAndCount(m.Duration))
				assert.Equal(t, 0, testutil.CollectAndCount(m.Failures))
				assert.Equal(t, []string{`/kv/alloc {"lease_ms":30000,"num_blocks":2,"request_id":"req-1"}`}, e.calls)
				assert.Equal(t, 0, pre.agent.HeldBlocks(), "the pull completed the hold")
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.is)
			assert.Equal(t, h, out, "the handoff is returned as it was")
			assert.Equal(t, tc.reason, FailureReason(err))
			if errors.Is(err, ErrAlloc) {
				var ue *upstream.UpstreamError
				require.ErrorAs(t, err, &ue)
				assert.Equal(t, localAddr, ue.Addr)
				assert.NotContains(t, err.Error(), "engine's own words")
			}
			if tc.handoff == nil {
				assert.Equal(t, 1.0, testutil.ToFloat64(m.Failures.WithLabelValues(label, tc.reason)))
			} else {
				assert.Equal(t, 0, testutil.CollectAndCount(m.Failures), "a refused descriptor is no pull")
				assert.Empty(t, e.calls, "nothing is borrowed for a refused descriptor")
			}
			var last string
			if len(e.calls) > 0 {
				last = e.calls[len(e.calls)-1]
			}
			assert.Equal(t, tc.freed, last == `/kv/free {"alloc_id":"a1"}`, "the borrowed blocks are freed: %q", e.calls)
			assert.Eventually(t, func() bool { return pre.agent.HeldBlocks() == tc.held }, time.Second, time.Millisecond,
				"the remote hold is released when nothing was borrowed")
			assert.Equal(t, 0, testutil.CollectAndCount(m.Duration))
		})
	}
}

// TestFailureReason: each pull error is counted under its reason.
func TestFailureReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("x: %w", kvtransfer.ErrKVAborted), metrics.KVPullAborted},
		{fmt.Errorf("x: %w", kvtransfer.ErrKVSourceGone), metrics.KVPullSourceGone},
		{fmt.Errorf("x: %w", kvtransfer.ErrKVNotHeld), metrics.KVPullNotHeld},
		{fmt.Errorf("x: %w", kvtransfer.ErrKVChecksum), metrics.KVPullChecksum},
		{fmt.Errorf("x: %w", kvtransfer.ErrKVSize), metrics.KVPullSize},
		{fmt.Errorf("x: %w", kvtransfer.ErrKVDeadline), metrics.KVPullDeadline},
		{fmt.Errorf("%w: %w", ErrAlloc, upstream.ErrBufferBudget), metrics.KVPullAlloc},
		{fmt.Errorf("x: %w", kvtransfer.ErrUnsupported), metrics.KVPullOther},
		{errors.New("x"), metrics.KVPullOther},
	} {
		assert.Equal(t, tc.want, FailureReason(tc.err), "%v", tc.err)
	}
}

// TestConfigValidate: negative settings are refused; zero ones take the
// defaults.
func TestConfigValidate(t *testing.T) {
	assert.NoError(t, Config{}.Validate())
	for _, c := range []Config{{AllocTimeout: -1}, {AllocLease: -1}, {MaxRegions: -1}} {
		assert.Error(t, c.Validate(), "%+v", c)
	}
	k := newTestPuller(t, Config{}, kvtransfer.NewMemTransport())
	assert.Equal(t, Config{AllocTimeout: 5 * time.Second, AllocLease: 30 * time.Second, MaxRegions: 8}, k.cfg)
}
