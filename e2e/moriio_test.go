package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// These tests run pd-sidecar in MoRI-IO write mode (nixlv2) between two
// engine-sim processes: the prefill engine writes the prompt's KV into the
// decode engine's notify port under the request's transfer_id, and the
// decode engine decodes from the written bytes. The simulators' counters
// prove the blocks moved (pushed, received, used) and the output is
// token-exact against a local run.

// moriRig is a reference engine, a prefill engine, a decode engine with a
// MoRI-IO notify port and a sidecar in MoRI-IO write mode.
type moriRig struct {
	pdRig
	ref    *harness.Engine
	notify int
}

const moriDP = 8

// newMoriRig starts the engines and the sidecar; flags are added to the
// sidecar's MoRI-IO ones.
func newMoriRig(t *testing.T, flags ...string) *moriRig {
	t.Helper()
	r := &moriRig{ref: harness.StartEngineSim(t, "both"), notify: harness.FreePort(t)}
	r.prefill = harness.StartEngineSim(t, "prefill")
	r.decode = harness.StartEngineSim(t, "decode", "--moriio-notify-port", itoa(r.notify), "--bootstrap-timeout", "5s")
	r.sc = harness.StartSidecar(t, r.decode.Port, append(moriFlags(r.notify), flags...)...)
	return r
}

// moriFlags are the sidecar's MoRI-IO flags for a decode engine whose
// notify port is notify, on this host.
func moriFlags(notify int) []string {
	return []string{"--kv-connector=nixlv2", "--moriio-write-mode=true", "--moriio-local-pod-ip=127.0.0.1",
		"--moriio-decode-notify-port=" + itoa(notify), "--moriio-dp-size=" + itoa(moriDP), "--moriio-tp-size=1"}
}

// headerFor names the prefiller and the request id (whose rank is fixed).
func (r *moriRig) headerFor(id string) map[string]string {
	return map[string]string{"x-prefiller-host-port": r.prefill.HostPort(), "x-request-id": id}
}

func (r *moriRig) refText(t *testing.T, path, body string) string {
	t.Helper()
	st, b, _ := scPost(t, r.ref.URL()+path, body, nil)
	require.Equal(t, http.StatusOK, st, "%s", b)
	return textOf(b)
}

// blocks reads a MoRI-IO block counter of e.
func blocks(t *testing.T, e *harness.Engine, name string) float64 {
	t.Helper()
	return e.Metric(t, "sim_moriio_blocks_"+name+"_total", nil)
}

// lastLeg is the last inference request e received.
func lastLeg(t *testing.T, e *harness.Engine) simRequest {
	t.Helper()
	reqs := simRequests(t, e)
	require.NotEmpty(t, reqs)
	return reqs[len(reqs)-1]
}

// assertMoriSplits runs every API through the rig and proves each split
// moved the KV by write: counters on both engines, token-exact text, the
// rank header on both legs.
func assertMoriSplits(t *testing.T, r *moriRig, parallel bool) {
	t.Helper()
	for i, c := range pathCases() {
		id := "mori-" + strings.ReplaceAll(strings.Trim(c.path, "/"), "/", "-")
		rank := moriio.PickRank(id, moriDP)
		body := c.body("")
		want := r.refText(t, c.path, body)
		pushed, received, used := blocks(t, r.prefill, "pushed"), blocks(t, r.decode, "received"), blocks(t, r.decode, "used")
		head := r.headerFor(id)
		head["x-data-parallel-rank"] = itoa(moriDP + 1) // the client's: never a split leg's
		st, got, _ := scPost(t, r.sc.URL()+c.path, body, head)
		require.Equal(t, http.StatusOK, st, "%s %s", c.path, got)
		assert.Equal(t, want, textOf(got), "%s: token-exact", c.path)
		moved := blocks(t, r.prefill, "pushed") - pushed
		assert.Positive(t, moved, "%s: the prefill engine wrote the KV", c.path)
		assert.Equal(t, moved, blocks(t, r.decode, "received")-received, "%s: the decode engine received it", c.path)
		assert.Equal(t, moved, blocks(t, r.decode, "used")-used, "%s: the decode read its KV from it", c.path)
		assert.Equal(t, float64(i+1), r.decode.Metric(t, "sim_moriio_decodes_total", nil), c.path)
		assert.Zero(t, r.decode.Metric(t, "sim_local_prefill_tokens_total", nil), "%s: no local prefill", c.path)

		pre, dec := lastLeg(t, r.prefill), lastLeg(t, r.decode)
		for _, leg := range []simRequest{pre, dec} {
			assert.Equal(t, []string{itoa(rank)}, leg.Headers["x-data-parallel-rank"], "%s: both legs pinned to rank %d", c.path, rank)
		}
		pkv := gjson.GetBytes(pre.Body, "kv_transfer_params")
		assert.Equal(t, "tx"+id, pkv.Get("transfer_id").String(), c.path)
		assert.Equal(t, "127.0.0.1", pkv.Get("remote_host").String(), c.path)
		assert.Equal(t, int64(r.notify), pkv.Get("remote_notify_port").Int(), c.path)
		assert.Equal(t, int64(rank), pkv.Get("remote_dp_rank").Int(), c.path)
		assert.Equal(t, int64(moriDP), pkv.Get("remote_dp_size").Int(), c.path)
		dkv := gjson.GetBytes(dec.Body, "kv_transfer_params")
		assert.Equal(t, "tx"+id, dkv.Get("transfer_id").String(), "%s: decode leg names the transfer", c.path)
		assert.True(t, dkv.Get("do_remote_prefill").Bool(), c.path)
		assert.True(t, dkv.Get("remote_dp_rank_override").Bool(), c.path)
		if parallel {
			assert.Equal(t, "127.0.0.1:6301", dkv.Get("remote_engine_id").String(), "%s: parallel decode params written up front", c.path)
		} else {
			assert.Equal(t, int64(r.notify), dkv.Get("remote_notify_port").Int(), "%s: decode notify port backfilled", c.path)
		}
	}
	// Both modes are the lane's (their host specs are literal IPs).
	assert.Equal(t, float64(len(pathCases())), r.scMetric(t, "pd_sidecar_loop_requests_total", nil), "splits served on the event loops")
	st, text, events := scStream(t, r.sc.URL()+"/v1/chat/completions", chatBody(`,"max_tokens":9,"stream":true`), r.headerFor("mori-stream"))
	require.Equal(t, http.StatusOK, st)
	_, want, _ := scStream(t, r.ref.URL()+"/v1/chat/completions", chatBody(`,"max_tokens":9,"stream":true`), nil)
	assert.Equal(t, want, text, "streamed: token-exact")
	assert.Equal(t, "[DONE]", events[len(events)-1])
	assert.Equal(t, 6.0, r.decode.Metric(t, "sim_moriio_decodes_total", nil))
	assert.Zero(t, r.scMetric(t, "pd_sidecar_fallbacks_total", nil))
	assert.Equal(t, 6.0, r.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
}

func TestMoriIOSerialSplit(t *testing.T) {
	r := newMoriRig(t)
	assertMoriSplits(t, r, false)
	assert.Equal(t, float64(len(pathCases())+1), r.scMetric(t, "pd_sidecar_loop_requests_total", nil), "the stream too")
	// The decode's tokens come from the written bytes: a prefill engine
	// that writes a corrupted block changes the answer.
	setFault(t, r.prefill, `{"corrupt_kv":true,"times":1}`)
	body := completionBody(`,"max_tokens":7`)
	st, got, _ := scPost(t, r.sc.URL()+"/v1/completions", body, r.headerFor("mori-corrupt"))
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.NotEqual(t, r.refText(t, "/v1/completions", body), textOf(got), "tokens depend on the written KV")
}

func TestMoriIOParallelSplit(t *testing.T) {
	r := newMoriRig(t, "--moriio-parallel-dispatch=true")
	assertMoriSplits(t, r, true)
	assert.Equal(t, float64(len(pathCases())+1), r.scMetric(t, "pd_sidecar_loop_requests_total", nil), "the stream too")
}

// A prefill leg failing in parallel dispatch before the decode produced
// output degrades to a local prefill, counted (llm-d answers the error).
func TestMoriIOParallelPrefillFailsFallsBackLocally(t *testing.T) {
	r := newMoriRig(t, "--moriio-parallel-dispatch=true")
	setFault(t, r.prefill, `{"status":500,"times":1}`)
	body := completionBody(`,"max_tokens":7`)
	st, got, _ := scPost(t, r.sc.URL()+"/v1/completions", body, r.headerFor("mori-fail"))
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.Equal(t, r.refText(t, "/v1/completions", body), textOf(got))
	assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "server_error"}))
	assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_requests_total", map[string]string{"mode": "fallback", "code": "200"}))
	assert.Zero(t, blocks(t, r.decode, "used"), "no KV was written")
	assert.Positive(t, r.decode.Metric(t, "sim_local_prefill_tokens_total", nil), "the decode engine prefilled locally")
	harness.Eventually(t, 30*time.Second, "the waiting decode leg was cancelled", func() bool { return running(t, r.decode) == 0 })
}

// No prefill outcome within --moriio-parallel-decode-wait-timeout is a
// counted fallback to local prefill, not a bare 504.
func TestMoriIOParallelWaitTimeoutFallsBack(t *testing.T) {
	r := newMoriRig(t, "--moriio-parallel-dispatch=true", "--moriio-parallel-decode-wait-timeout=400ms", "--prefill-timeout=60s")
	// The prefill answers only after 40 s, so an answer well before that
	// is the wait timeout's fallback on any machine.
	setFault(t, r.prefill, `{"latency_ms":40000,"times":1}`)
	body := completionBody(`,"max_tokens":7`)
	var st int
	var got []byte
	took := within(t, 400*time.Millisecond+15*time.Second, func() {
		st, got, _ = scPost(t, r.sc.URL()+"/v1/completions", body, r.headerFor("mori-slow"))
	})
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.GreaterOrEqual(t, took, 400*time.Millisecond)
	assert.Equal(t, r.refText(t, "/v1/completions", body), textOf(got))
	assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "kv_wait_timeout"}))
	assert.Zero(t, blocks(t, r.decode, "used"))
}

// A host spec that does not resolve at start-up exits 2 with one line.
func TestMoriIODNSStartupFailureExits2(t *testing.T) {
	p := harness.Start(t, harness.Binary(t, "pd-sidecar"), "--port", itoa(harness.FreePort(t)),
		"--moriio-write-mode=true", "--moriio-local-pod-ip=decode.no-such-zone.invalid")
	code, err := p.Wait(20 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, 2, code)
	out := strings.TrimSpace(p.Output())
	assert.NotContains(t, out, "\n", "one line")
	assert.Contains(t, out, `MoRI-IO host "decode.no-such-zone.invalid" does not resolve`)
}

// llm-d's 2P2D MoRI-IO arg list (llm-d-router v0.10's deployment manifests) verbatim, its
// Service names answered by a DNS server: it starts and serves a split;
// when the names stop resolving, the last addresses are used (stale) and
// the failed re-resolutions are counted.
func TestMoriIODNSStaleWhileRevalidate(t *testing.T) {
	dns := harness.StartDNSServer(t, map[string]string{
		"prefill-master.ns.svc": "127.0.0.1", "prefill-worker.ns.svc": "127.0.0.2",
		"decode-master.ns.svc": "127.0.0.1", "decode-worker.ns.svc": "127.0.0.3", "decode-pod.ns.svc": "127.0.0.1",
	})
	t.Setenv("MORIIO_DNS_SERVER", dns.Addr)
	t.Setenv("MORIIO_DNS_RESOLVE_TTL_SECONDS", "0.2")
	t.Setenv("MORIIO_DNS_RESOLVE_TIMEOUT_SECONDS", "1")
	r := &moriRig{ref: harness.StartEngineSim(t, "both"), notify: harness.FreePort(t)}
	r.prefill = harness.StartEngineSim(t, "prefill")
	r.decode = harness.StartEngineSim(t, "decode", "--moriio-notify-port", itoa(r.notify), "--bootstrap-timeout", "5s")
	r.sc = harness.StartSidecar(t, r.decode.Port, strings.Fields(
		"--moriio-write-mode=true --moriio-dp-size=16 --moriio-dp-size-local=8 --moriio-tp-size=1 "+
			"--moriio-remote-hosts=prefill-master.ns.svc,prefill-worker.ns.svc "+
			"--moriio-decode-hosts=decode-master.ns.svc,decode-worker.ns.svc "+
			"--moriio-local-pod-ip=decode-pod.ns.svc --moriio-decode-notify-port="+itoa(r.notify))...)
	body := completionBody(`,"max_tokens":7`)
	want := r.refText(t, "/v1/completions", body)
	split := func(id string) {
		t.Helper()
		used := blocks(t, r.decode, "used")
		st, got, _ := scPost(t, r.sc.URL()+"/v1/completions", body, r.headerFor(id))
		require.Equal(t, http.StatusOK, st, "%s", got)
		assert.Equal(t, want, textOf(got))
		assert.Positive(t, blocks(t, r.decode, "used")-used, "%s: the KV was written into the decode engine", id)
	}
	split("dns-1")
	pkv := gjson.GetBytes(lastLeg(t, r.prefill).Body, "kv_transfer_params")
	assert.Equal(t, "127.0.0.1", pkv.Get("remote_host").String(), "the pod IP resolved")
	assert.Equal(t, `["127.0.0.1","127.0.0.3"]`, pkv.Get("remote_hosts").Raw, "the decode hosts resolved")
	assert.Equal(t, int64(8), pkv.Get("remote_dp_size_local").Int())
	dkv := gjson.GetBytes(lastLeg(t, r.decode).Body, "kv_transfer_params")
	assert.Equal(t, `["127.0.0.1","127.0.0.2"]`, dkv.Get("remote_hosts").Raw, "the prefill hosts resolved")
	assert.Zero(t, r.scMetric(t, "moriio_dns_lookup_failures_total", nil))

	dns.Fail(true)
	time.Sleep(300 * time.Millisecond) // past the 0.2 s TTL (a sleep never ends early): every address is stale
	split("dns-2")
	harness.Eventually(t, 30*time.Second, "failed re-resolutions counted", func() bool {
		return r.scMetric(t, "moriio_dns_lookup_failures_total", nil) >= 1
	})
	assert.Positive(t, r.scMetric(t, "moriio_dns_reresolve_total", nil))
	pkv = gjson.GetBytes(lastLeg(t, r.prefill).Body, "kv_transfer_params")
	assert.Equal(t, "127.0.0.1", pkv.Get("remote_host").String(), "the stale address is used")
	assert.Equal(t, `["127.0.0.1","127.0.0.3"]`, pkv.Get("remote_hosts").Raw, "stale decode hosts")
	assert.Zero(t, r.scMetric(t, "pd_sidecar_fallbacks_total", nil))
	assert.Zero(t, r.scMetric(t, "moriio_dns_ip_changed_total", nil))
}

// TestMoriIOLLMDArgListsServeASplit starts pd-sidecar with the MoRI-IO
// decode-sidecar arg lists of llm-d's MORIIO_README (llm-d-router v0.10)
// verbatim, POD_IP from the environment as in a pod, the 2P2D
// list's Service names answered by a DNS server, and only the decode
// notify port added (the engine listens where the test put it); each
// serves a split whose KV the prefill engine wrote into the decode engine.
func TestMoriIOLLMDArgListsServeASplit(t *testing.T) {
	const serial = "--moriio-write-mode=true --moriio-dp-size=8 --moriio-tp-size=1"
	for _, tc := range []struct{ name, args string }{
		{"1P1D serial", serial},
		{"1P1D parallel", serial + " --moriio-parallel-dispatch=true"},
		{"2P2D", "--moriio-write-mode=true --moriio-dp-size=16 --moriio-dp-size-local=8 --moriio-tp-size=1 " +
			"--moriio-remote-hosts=prefill-master.ns.svc,prefill-worker.ns.svc --moriio-decode-hosts=decode-master.ns.svc,decode-worker.ns.svc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dns := harness.StartDNSServer(t, map[string]string{
				"prefill-master.ns.svc": "127.0.0.1", "prefill-worker.ns.svc": "127.0.0.2",
				"decode-master.ns.svc": "127.0.0.1", "decode-worker.ns.svc": "127.0.0.3",
			})
			t.Setenv("MORIIO_DNS_SERVER", dns.Addr)
			t.Setenv("POD_IP", "127.0.0.1")
			prefill := harness.StartEngineSim(t, "prefill")
			notify := harness.FreePort(t)
			decode := harness.StartEngineSim(t, "decode", "--moriio-notify-port", itoa(notify), "--bootstrap-timeout", "5s")
			sc := harness.StartSidecar(t, decode.Port, append(strings.Fields(tc.args), "--moriio-decode-notify-port="+itoa(notify))...)
			st, got, _ := scPost(t, sc.URL()+"/v1/completions", completionBody(`,"max_tokens":5`),
				map[string]string{"x-prefiller-host-port": prefill.HostPort()})
			require.Equal(t, http.StatusOK, st, "%s", got)
			assert.Positive(t, blocks(t, prefill, "pushed"), "the prefill engine wrote the KV")
			assert.Equal(t, blocks(t, prefill, "pushed"), blocks(t, decode, "used"), "the decode engine decoded from it")
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
		})
	}
}

// Serial write mode whose prefill engine cannot write the KV (the decode
// notify port names nothing): the prefill fails, and the request degrades
// to a local prefill, counted.
func TestMoriIOSerialWriteFailsFallsBackLocally(t *testing.T) {
	r := newMoriRig(t, "--moriio-decode-notify-port="+itoa(harness.FreePort(t)))
	body := completionBody(`,"max_tokens":7`)
	st, got, _ := scPost(t, r.sc.URL()+"/v1/completions", body, r.headerFor("mori-nowhere"))
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.Equal(t, r.refText(t, "/v1/completions", body), textOf(got))
	assert.Equal(t, 1.0, r.scMetric(t, "pd_sidecar_fallbacks_total", map[string]string{"reason": "server_error"}))
	assert.Zero(t, blocks(t, r.prefill, "pushed"))
	assert.Zero(t, blocks(t, r.decode, "used"))
}
