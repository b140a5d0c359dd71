package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// These tests run the sidecar connector (--kv-connector sidecar): the
// sidecar pulls the prefiller's KV blocks itself, over a kvtransfer
// transport, into blocks it borrows from the decode engine's shared-memory
// region, and the decode engine decodes from them. Every process is real;
// assertions are on the simulators' proof counters, the agent's held-blocks
// gauge and token-exact output (which is a function of the pulled bytes).

func TestKVPullTCP(t *testing.T) { testKVPull(t, "tcp") }

// kvEngines is a prefill and a decode engine-sim, both with a kvtransfer
// agent and a host region.
type kvEngines struct {
	tr               string
	prefill, decode  *harness.Engine
	prefillAgentPort int
}

// startKVEngines starts both engines; extra flags go to both (the KV
// geometry must match).
func startKVEngines(t *testing.T, tr string, extra ...string) *kvEngines {
	t.Helper()
	e := &kvEngines{tr: tr, prefillAgentPort: harness.FreePort(t)}
	flags := func(port int) []string {
		return []string{"--kv-agent-transport", tr, "--kv-agent-port", itoa(port), "--kv-region-dir", t.TempDir(),
			"--num-kv-blocks", "2048", "--kv-bandwidth", "0"}
	}
	e.prefill = harness.StartEngineSim(t, "prefill", append(flags(e.prefillAgentPort), extra...)...)
	e.decode = harness.StartEngineSim(t, "decode", append(flags(harness.FreePort(t)), extra...)...)
	return e
}

// sidecar starts a pd-sidecar with the sidecar connector before the decode
// engine.
func (e *kvEngines) sidecar(t *testing.T, flags ...string) *harness.Sidecar {
	t.Helper()
	return harness.StartSidecar(t, e.decode.Port, append([]string{"--kv-connector", "sidecar", "--kv-transport", e.tr}, flags...)...)
}

func (e *kvEngines) header() map[string]string {
	return map[string]string{"x-prefiller-host-port": e.prefill.HostPort()}
}

// local answers body on the decode engine alone: the reference output.
func (e *kvEngines) local(t *testing.T, path, body string) []byte {
	t.Helper()
	st, b, _ := scPost(t, e.decode.URL()+path, body, nil)
	require.Equal(t, http.StatusOK, st, "%s", b)
	return b
}

// assertNothingHeld waits until neither engine holds or lends a block.
func (e *kvEngines) assertNothingHeld(t *testing.T) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, "no KV held anywhere", func() bool {
		return e.prefill.Metric(t, "kvtransfer_agent_held_blocks", nil) == 0 &&
			e.prefill.Metric(t, "sim_kv_blocks_held", nil) == 0 &&
			e.decode.Metric(t, "sim_kv_blocks_held", nil) == 0
	})
}

// tokenPrompt is a completions body whose prompt is n token ids.
func tokenPrompt(n, maxTokens int, extra string) string {
	var b strings.Builder
	b.WriteString(`{"model":"sim-model","max_tokens":` + itoa(maxTokens) + extra + `,"prompt":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(itoa(300 + (i*7919)%4000))
	}
	b.WriteString("]}")
	return b.String()
}

func testKVPull(t *testing.T, tr string) {
	t.Run("pulled KV decodes token-exact, JSON and SSE", func(t *testing.T) {
		e := startKVEngines(t, tr)
		sc := e.sidecar(t)
		body := tokenPrompt(300, 12, "")
		want := e.local(t, "/v1/completions", body)
		st, got, _ := scPost(t, sc.URL()+"/v1/completions", body, e.header())
		require.Equal(t, http.StatusOK, st, "%s", got)
		assert.Equal(t, textOf(want), textOf(got), "output from pulled blocks must equal a local prefill's")

		chat := chatBody(`,"max_tokens":10,"stream":true`)
		st, wantText, _ := scStream(t, e.decode.URL()+"/v1/chat/completions", chat, nil)
		require.Equal(t, http.StatusOK, st)
		st, gotText, events := scStream(t, sc.URL()+"/v1/chat/completions", chat, e.header())
		require.Equal(t, http.StatusOK, st)
		assert.Equal(t, wantText, gotText)
		assert.Equal(t, "[DONE]", events[len(events)-1])

		// Proof: both decodes started from blocks the sidecar pulled; the
		// decode engine prefilled only the two reference runs itself.
		assert.Equal(t, 2.0, e.decode.Metric(t, "sim_kv_preloaded_decodes_total", nil))
		assert.Equal(t, 2.0, e.decode.Metric(t, "sim_kv_allocs_total", nil))
		assert.Equal(t, 2.0, e.prefill.Metric(t, "kvtransfer_agent_releases_total", map[string]string{"reason": "completed"}))
		pulled := sc.Metric(t, "pd_sidecar_kv_pull_bytes_total", map[string]string{"prefiller": e.prefill.HostPort(), "transport": tr})
		assert.GreaterOrEqual(t, pulled, float64(300*256), "at least the completion prompt's 300 tokens of 256 bytes")
		assert.Equal(t, 2.0, sc.Metric(t, "pd_sidecar_kv_pull_duration_seconds", map[string]string{"transport": tr}))
		assert.Equal(t, 2.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
		assert.Zero(t, sc.Metric(t, "pd_sidecar_fallbacks_total", nil))
		e.assertNothingHeld(t)

		// kv-probe measures the same agent from the command line, over the
		// transport's own data path, at every block size it is asked for.
		out, err := exec.Command(harness.Binary(t, "pd-sidecar"), "kv-probe", "--peer", harness.HostPort(e.prefillAgentPort),
			"--transport", tr, "--block-sizes", "4KiB,1MiB", "--size", "4MiB", "--count", "3", "--json").Output()
		require.NoError(t, err, "%s", out)
		var rep struct {
			Transport   string `json:"transport"`
			Lanes       string `json:"lanes"`
			LaneSummary string `json:"lane_summary"`
			Blocks      []struct {
				BlockBytes int     `json:"block_bytes"`
				P50        int64   `json:"p50_ns"`
				Bytes      int     `json:"bytes"`
				GBps       float64 `json:"gb_per_s"`
				UCXMemGBps float64 `json:"ucx_memory_gb_per_s"`
			} `json:"blocks"`
			Verdict string `json:"verdict"`
		}
		require.NoError(t, json.Unmarshal(out, &rep), "%s", out)
		assert.Equal(t, tr, rep.Transport)
		require.Len(t, rep.Blocks, 2)
		for i, bs := range []int{4 << 10, 1 << 20} {
			assert.Equal(t, bs, rep.Blocks[i].BlockBytes)
			assert.Equal(t, 4<<20, rep.Blocks[i].Bytes)
			assert.Positive(t, rep.Blocks[i].P50)
			assert.Positive(t, rep.Blocks[i].GBps)
		}
		assert.Contains(t, rep.Verdict, "GB/s at 1MiB blocks")
		if tr == "ucx" {
			// The lanes UCX picked: on loopback tcp or shared memory.
			assert.Contains(t, rep.Lanes, "UCP endpoint")
			assert.Regexp(t, `tcp/|sysv/|posix/`, rep.LaneSummary)
			if tls := os.Getenv("UCX_TLS"); tls != "" && !strings.Contains(tls, "tcp") {
				assert.NotContains(t, rep.LaneSummary, "tcp/", "UCX_TLS=%s", tls)
			}
			for _, b := range rep.Blocks {
				assert.Positive(t, b.UCXMemGBps, "%d-byte blocks from UCX-allocated memory", b.BlockBytes)
			}
		}
	})

	t.Run("corrupted block: policy applies, and unverified bytes change the output", func(t *testing.T) {
		e := startKVEngines(t, tr)
		recompute := e.sidecar(t)
		strict := e.sidecar(t, "--on-kv-load-failure", "error")
		blind := e.sidecar(t, "--kv-skip-checksums")
		body := tokenPrompt(200, 8, "")
		want := textOf(e.local(t, "/v1/completions", body))

		setFault(t, e.prefill, `{"corrupt_kv":true,"only":"prefill","times":1}`)
		st, got, _ := scPost(t, recompute.URL()+"/v1/completions", body, e.header())
		require.Equal(t, http.StatusOK, st, "%s", got)
		assert.Equal(t, want, textOf(got), "local prefill after the checksum failure")
		assert.Equal(t, 1.0, recompute.Metric(t, "pd_sidecar_kv_pull_failures_total", map[string]string{"reason": "checksum"}))
		assert.Equal(t, 1.0, recompute.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "kv_load_failed"}))
		assert.Equal(t, 1.0, e.decode.Metric(t, "sim_kv_frees_total", nil), "borrowed blocks returned")
		assert.Zero(t, e.decode.Metric(t, "sim_kv_preloaded_decodes_total", nil), "a partial pull never reaches the engine")

		setFault(t, e.prefill, `{"corrupt_kv":true,"only":"prefill","times":1}`)
		st, got, _ = scPost(t, strict.URL()+"/v1/completions", body, e.header())
		assert.Equal(t, http.StatusInternalServerError, st, "%s", got)
		assert.Equal(t, 1.0, strict.Metric(t, "pd_sidecar_kv_load_failures_total", nil))

		setFault(t, e.prefill, `{"corrupt_kv":true,"only":"prefill","times":1}`)
		st, got, _ = scPost(t, blind.URL()+"/v1/completions", body, e.header())
		require.Equal(t, http.StatusOK, st, "%s", got)
		assert.NotEqual(t, want, textOf(got), "one flipped byte in the pulled KV changes the tokens")
		assert.Equal(t, 1.0, e.decode.Metric(t, "sim_kv_preloaded_decodes_total", nil))
		assert.Equal(t, 2.0, e.prefill.Metric(t, "kvtransfer_agent_releases_total", map[string]string{"reason": "released"}))
		e.assertNothingHeld(t)
	})

	t.Run("agent killed mid-pull: local prefill, nothing held", func(t *testing.T) {
		// 400 tokens of 4 KiB at 100 kB/s a stream (4 streams): a pull of
		// 4 s at least, which the kill, once the decode engine has lent the
		// pull its blocks, lands inside on any machine.
		e := startKVEngines(t, tr, "--kv-bytes-per-token", "4096", "--kv-bandwidth", "100000")
		sc := e.sidecar(t)
		body := tokenPrompt(400, 6, "")
		want := textOf(e.local(t, "/v1/completions", body))
		var wg sync.WaitGroup
		var st int
		var got []byte
		wg.Go(func() { st, got, _ = scPost(t, sc.URL()+"/v1/completions", body, e.header()) })
		harness.Eventually(t, 30*time.Second, "the pull started: blocks lent to it on the decode engine", func() bool {
			return e.decode.Metric(t, "sim_kv_allocs_total", nil) > 0
		})
		e.prefill.Kill()
		wg.Wait()
		require.Equal(t, http.StatusOK, st, "%s", got)
		assert.Equal(t, want, textOf(got))
		assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "kv_source_gone"}))
		assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_kv_pull_failures_total", map[string]string{"reason": "source_gone"}))
		assert.Equal(t, 1.0, e.decode.Metric(t, "sim_kv_frees_total", nil))
		assert.Zero(t, e.decode.Metric(t, "sim_kv_preloaded_decodes_total", nil))
		assert.Zero(t, e.decode.Metric(t, "sim_kv_blocks_held", nil), "nothing lent on the decode engine")
	})

	t.Run("lease expiry releases the hold; an expired hold follows the policy", func(t *testing.T) {
		e := startKVEngines(t, tr, "--kv-lease", "300ms")
		sc := e.sidecar(t)
		body := tokenPrompt(100, 6, "")
		// A prefill nobody pulls: the agent frees it at lease expiry.
		pre := tokenPrompt(100, 1, `,"kv_transfer_params":{"do_remote_decode":true,"pull_mode":"sidecar"}`)
		st, b, _ := scPost(t, e.prefill.URL()+"/v1/completions", pre, nil)
		require.Equal(t, http.StatusOK, st, "%s", b)
		require.True(t, gjson.GetBytes(b, "kv_transfer_params.kv_source.agent").Exists(), "%s", b)
		assert.Positive(t, e.prefill.Metric(t, "kvtransfer_agent_held_blocks", nil))
		harness.Eventually(t, 30*time.Second, "lease expired", func() bool {
			return e.prefill.Metric(t, "kvtransfer_agent_releases_total", map[string]string{"reason": "expired"}) == 1
		})
		e.assertNothingHeld(t)

		want := textOf(e.local(t, "/v1/completions", body))
		setFault(t, e.prefill, `{"expire_kv":true,"only":"prefill","times":1}`)
		st, got, _ := scPost(t, sc.URL()+"/v1/completions", body, e.header())
		require.Equal(t, http.StatusOK, st, "%s", got)
		assert.Equal(t, want, textOf(got))
		assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_kv_pull_failures_total", map[string]string{"reason": "not_held"}))
		assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "kv_load_failed"}))
		assert.Equal(t, 2.0, e.prefill.Metric(t, "kvtransfer_agent_releases_total", map[string]string{"reason": "expired"}))
		e.assertNothingHeld(t)
	})

	t.Run("client cancel mid-pull releases both sides at once", func(t *testing.T) {
		// A pull of 4 s at least (as above): the cancel, once the decode
		// engine has lent the pull its blocks, lands inside it.
		e := startKVEngines(t, tr, "--kv-bytes-per-token", "4096", "--kv-bandwidth", "100000")
		sc := e.sidecar(t)
		body := tokenPrompt(400, 6, "")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sc.URL()+"/v1/completions", strings.NewReader(body))
			req.Header.Set("x-prefiller-host-port", e.prefill.HostPort())
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		harness.Eventually(t, 30*time.Second, "the pull started: blocks lent to it on the decode engine", func() bool {
			return e.decode.Metric(t, "sim_kv_allocs_total", nil) > 0
		})
		// The pull dials the agent right after the loan; a cancel before
		// that connection leaves the hold to its lease (Puller.Pull returns
		// without a connection to release it over), so it comes a moment
		// later, well inside the 4 s pull.
		time.Sleep(200 * time.Millisecond)
		cancel()
		<-done
		start := time.Now()
		e.assertNothingHeld(t)
		assert.Less(t, time.Since(start), 20*time.Second, "released by the sidecar, not by the 30 s lease")
		assert.Equal(t, 1.0, e.prefill.Metric(t, "kvtransfer_agent_releases_total", map[string]string{"reason": "released"}))
		assert.Zero(t, e.prefill.Metric(t, "kvtransfer_agent_releases_total", map[string]string{"reason": "expired"}))
		harness.Eventually(t, 30*time.Second, "pull counted as aborted", func() bool {
			return sc.Metric(t, "pd_sidecar_kv_pull_failures_total", map[string]string{"reason": "aborted"}) == 1
		})
		assert.Equal(t, 1.0, e.decode.Metric(t, "sim_kv_frees_total", nil))
		assert.Zero(t, e.decode.Metric(t, "sim_kv_preloaded_decodes_total", nil))
	})
}
