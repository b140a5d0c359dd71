package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// The P2P KV tier (offloading, nixlv2 with --enable-p2p-pull) between real
// engine-sim processes laid out as llm-d lays out pods: each "pod" is its
// own loopback address, its rank r serving HTTP on the sidecar's --port+r
// and its P2P tier on --p2p-connector-port+r, so the sidecar derives every
// P2P address from headers alone. Proof is the engines' P2P counters
// (blocks held, pulled and served move only when bytes moved) and output
// tokens equal to a local run (they depend on every KV byte).

// p2pPod is one pod's engines: rank r on host:httpBase+r, P2P p2pBase+r.
type p2pPod struct {
	host  string
	ranks []*harness.Engine
}

// hostPort is rank r's HTTP address, as the endpoint picker names it.
func (p *p2pPod) hostPort(r int) string { return p.ranks[r].HostPort() }

// startP2PPod starts n engines of role on host, rank r on HTTP port
// httpBase+r and P2P port p2pBase+r.
func startP2PPod(t *testing.T, role, host string, n, httpBase, p2pBase int) *p2pPod {
	t.Helper()
	pod := &p2pPod{host: host}
	for r := range n {
		pod.ranks = append(pod.ranks, harness.StartEngineSim(t, role, "--host", host,
			"--port", itoa(httpBase+r), "--p2p-port", itoa(p2pBase+r)))
	}
	return pod
}

// p2pPrompt is several full KV blocks long, so a source has a prefix to
// serve.
var p2pPrompt = strings.Repeat(simPrompt+" ", 3)

func p2pBody(extra string) string {
	return `{"model":"sim-model","prompt":` + quote(p2pPrompt) + `,"max_tokens":6` + extra + `}`
}

// p2pRig: a sidecar with two data-parallel ranks on 127.0.0.1 in front of
// two decode engines; a prefill pod (127.0.0.2) and a source pod
// (127.0.0.3), two ranks each, on the sidecar's ports; a reference engine.
type p2pRig struct {
	sc                      *harness.Sidecar
	decode, prefill, source *p2pPod
	ref                     *harness.Engine
}

func newP2PRig(t *testing.T, flags ...string) *p2pRig {
	t.Helper()
	model := harness.FreePorts(t, 2)
	p2p := harness.FreePorts(t, 2)
	r := &p2pRig{ref: harness.StartEngineSim(t, "both")}
	r.sc = harness.StartSidecar(t, model, append([]string{"--host", "127.0.0.1", "--data-parallel-size", "2",
		"--p2p-connector-port", itoa(p2p)}, flags...)...)
	r.decode = startP2PPod(t, "decode", "127.0.0.1", 2, model, p2p)
	r.prefill = startP2PPod(t, "prefill", "127.0.0.2", 2, r.sc.Port, p2p)
	r.source = startP2PPod(t, "both", "127.0.0.3", 2, r.sc.Port, p2p)
	return r
}

// want is the reference engine's answer text for body.
func (r *p2pRig) want(t *testing.T, body string) string {
	t.Helper()
	st, b, _ := scPost(t, r.ref.URL()+"/v1/completions", body, nil)
	require.Equal(t, http.StatusOK, st, "%s", b)
	return textOf(b)
}

// warm runs body on source rank rk, so that its prefix cache holds the
// prompt.
func (r *p2pRig) warm(t *testing.T, rk int, body string) {
	t.Helper()
	st, b, _ := scPost(t, r.source.ranks[rk].URL()+"/v1/completions", body, nil)
	require.Equal(t, http.StatusOK, st, "%s", b)
}

// p2p reads one of an engine's sim_p2p_* counters of kind.
func p2p(t *testing.T, e *harness.Engine, name, kind string) float64 {
	t.Helper()
	var labels map[string]string
	if kind != "" {
		labels = map[string]string{"kind": kind}
	}
	return e.Metric(t, "sim_p2p_"+name+"_total", labels)
}

// TestOffloadingP2PRanksAndSource: an offloading split names prefill rank 1
// and a KV cache source on the source pod's rank 1. Prefill rank 1 pulls the
// prompt's cached prefix from source rank 1 over its P2P tier and holds the
// prompt; decode rank 0 pulls it from prefill rank 1's P2P port
// (--p2p-connector-port+1); no other engine moves; the tokens are a local
// run's.
func TestOffloadingP2PRanksAndSource(t *testing.T) {
	r := newP2PRig(t, "--kv-connector", "offloading")
	body := p2pBody("")
	want := r.want(t, body)
	r.warm(t, 1, body)

	st, got, _ := scPost(t, r.sc.URL()+"/v1/completions", body, map[string]string{
		"x-prefiller-host-port":       r.prefill.hostPort(1),
		"x-kv-cache-source-host-port": "http://" + r.source.hostPort(1),
	})
	require.Equal(t, http.StatusOK, st, "%s", got)
	assert.Equal(t, want, textOf(got), "token-exact")

	pre, src, dec := r.prefill.ranks[1], r.source.ranks[1], r.decode.ranks[0]
	assert.Equal(t, 1.0, p2p(t, pre, "holds", ""), "prefill rank 1 held the prompt for the decoder")
	assert.Equal(t, 1.0, p2p(t, dec, "pulls", "prefill"), "decode rank 0 pulled it over the P2P tier")
	assert.Positive(t, p2p(t, dec, "blocks_pulled", "prefill"))
	assert.Equal(t, p2p(t, dec, "blocks_pulled", "prefill"), p2p(t, pre, "blocks_served", "prefill"), "every block the decoder used came from the prefiller")
	pulled := p2p(t, pre, "blocks_pulled", "source")
	assert.Equal(t, 1.0, p2p(t, pre, "pulls", "source"), "prefill rank 1 pulled from the source first")
	assert.Positive(t, pulled, "the source served the cached prefix")
	assert.Equal(t, pulled, p2p(t, src, "blocks_served", "source"))
	for name, e := range map[string]*harness.Engine{"prefill rank 0": r.prefill.ranks[0], "source rank 0": r.source.ranks[0], "decode rank 1": r.decode.ranks[1]} {
		assert.Zero(t, p2p(t, e, "holds", ""), name)
		assert.Zero(t, p2p(t, e, "blocks_served", ""), name)
		assert.Zero(t, p2p(t, e, "pulls", ""), name)
	}
	assert.Equal(t, 1.0, r.sc.Metric(t, "pd_sidecar_kv_sources_total", map[string]string{"outcome": "used"}))
	assert.Equal(t, 1.0, r.sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
	assert.Zero(t, r.sc.Metric(t, "pd_sidecar_fallbacks_total", nil))
}

// TestKVSourceOutcomes: what the sidecar does with each kind of
// x-kv-cache-source-host-port under offloading, proven by who pulled what.
// The allowlist admits the decode and prefill pods, not the source pod.
func TestKVSourceOutcomes(t *testing.T) {
	r := newP2PRig(t, "--kv-connector", "offloading", "--enable-ssrf-protection",
		"--prefiller-allowlist", "127.0.0.1:*,127.0.0.2:*")
	body := p2pBody("")
	want := r.want(t, body)
	r.warm(t, 1, body)
	pre0, dec0, dec1 := r.prefill.ranks[0], r.decode.ranks[0], r.decode.ranks[1]
	sources := func(outcome string) float64 {
		return r.sc.Metric(t, "pd_sidecar_kv_sources_total", map[string]string{"outcome": outcome})
	}
	sendBody := func(body, want string, hdr map[string]string) {
		t.Helper()
		st, got, _ := scPost(t, r.sc.URL()+"/v1/completions", body, hdr)
		require.Equal(t, http.StatusOK, st, "%s", got)
		assert.Equal(t, want, textOf(got), "token-exact")
	}
	send := func(hdr map[string]string) { t.Helper(); sendBody(body, want, hdr) }

	t.Run("not allowed: ignored, never contacted", func(t *testing.T) {
		send(map[string]string{"x-prefiller-host-port": r.prefill.hostPort(0), "x-kv-cache-source-host-port": r.source.hostPort(1)})
		assert.Equal(t, 1.0, sources("not_allowed"))
		assert.Zero(t, p2p(t, r.source.ranks[1], "blocks_served", ""), "the source was never contacted")
		assert.Zero(t, p2p(t, pre0, "pulls", "source"))
		assert.Zero(t, p2p(t, pre0, "pull_failures", "source"))
		assert.Equal(t, 1.0, p2p(t, pre0, "holds", ""), "the split itself happened")
		assert.Equal(t, 1.0, p2p(t, dec0, "pulls", "prefill"))
	})
	t.Run("the prefiller itself: not named", func(t *testing.T) {
		send(map[string]string{"x-prefiller-host-port": r.prefill.hostPort(0), "x-kv-cache-source-host-port": "HTTP://" + r.prefill.hostPort(0)})
		assert.Equal(t, 1.0, sources("prefiller"))
		assert.Zero(t, p2p(t, pre0, "pulls", "source"))
		assert.Equal(t, 2.0, p2p(t, pre0, "holds", ""))
	})
	t.Run("malformed: ignored", func(t *testing.T) {
		send(map[string]string{"x-prefiller-host-port": r.prefill.hostPort(0), "x-kv-cache-source-host-port": "127.0.0.3:http"})
		assert.Equal(t, 1.0, sources("malformed"))
		assert.Equal(t, 3.0, p2p(t, dec0, "pulls", "prefill"))
	})
	t.Run("no prefiller, this rank: not named", func(t *testing.T) {
		send(map[string]string{"x-kv-cache-source-host-port": harness.HostPort(r.sc.Port)})
		assert.Equal(t, 1.0, sources("own_rank"))
		assert.Zero(t, p2p(t, dec0, "pulls", "source"))
	})
	t.Run("no prefiller, another rank of this pod: the local engine pulls from it", func(t *testing.T) {
		// A prompt rank 0 never saw (an engine pulls only what its own
		// prefix cache lacks), which rank 1 caches.
		fresh := `{"model":"sim-model","prompt":` + quote("Once more: "+p2pPrompt) + `,"max_tokens":6}`
		st, b, _ := scPost(t, dec1.URL()+"/v1/completions", fresh, nil)
		require.Equal(t, http.StatusOK, st, "%s", b)
		onLoops := r.sc.Metric(t, "pd_sidecar_loop_requests_total", nil)
		sendBody(fresh, r.want(t, fresh), map[string]string{"x-kv-cache-source-host-port": harness.HostPort(r.sc.Port + 1)})
		assert.Equal(t, onLoops+1, r.sc.Metric(t, "pd_sidecar_loop_requests_total", nil), "served on the event loops")
		assert.Equal(t, 1.0, sources("used"))
		assert.Equal(t, 1.0, p2p(t, dec0, "pulls", "source"), "decode rank 0 pulled from rank 1's P2P port")
		assert.Positive(t, p2p(t, dec0, "blocks_pulled", "source"))
		assert.Equal(t, p2p(t, dec0, "blocks_pulled", "source"), p2p(t, dec1, "blocks_served", "source"))
		assert.Equal(t, 2.0, r.sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "local", "code": "200"}), "both requests without a prefiller ran locally")
	})
	assert.Zero(t, r.sc.Metric(t, "pd_sidecar_fallbacks_total", nil))
}

// TestNixlP2PPull: nixlv2 composes the source pull onto its prefill leg
// with --enable-p2p-pull (the decode still takes the KV over NIXL), and
// ignores the header without it.
func TestNixlP2PPull(t *testing.T) {
	for _, c := range []struct {
		name  string
		flags []string
		on    bool
		lane  bool // served on the event loops (the lane), not fasthttp's path
	}{
		{"enable-p2p-pull", []string{"--enable-p2p-pull"}, true, true},
		{"enable-p2p-pull, stream-loops=0", []string{"--enable-p2p-pull", "--stream-loops=0"}, true, false},
		{"without enable-p2p-pull", nil, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newP2PRig(t, c.flags...)
			body := p2pBody("")
			want := r.want(t, body)
			r.warm(t, 0, body)
			st, got, _ := scPost(t, r.sc.URL()+"/v1/completions", body, map[string]string{
				"x-prefiller-host-port":       r.prefill.hostPort(0),
				"x-kv-cache-source-host-port": r.source.hostPort(0),
			})
			require.Equal(t, http.StatusOK, st, "%s", got)
			assert.Equal(t, want, textOf(got), "token-exact")
			pre, dec := r.prefill.ranks[0], r.decode.ranks[0]
			assert.Equal(t, 1.0, dec.Metric(t, "sim_remote_kv_decodes_total", nil), "the decode took the KV over NIXL")
			assert.Equal(t, 1.0, pre.Metric(t, "sim_remote_decode_prefills_total", nil))
			assert.Zero(t, p2p(t, dec, "pulls", ""), "no P2P pull on the decode leg")
			onLoops := 0.0
			if c.lane {
				onLoops = 1
			}
			assert.Equal(t, onLoops, r.sc.Metric(t, "pd_sidecar_loop_requests_total", nil), "the serving path")
			if !c.on {
				assert.Zero(t, p2p(t, pre, "pulls", ""), "the header is ignored")
				assert.Zero(t, r.sc.Metric(t, "pd_sidecar_kv_sources_total", nil))
				return
			}
			assert.Equal(t, 1.0, p2p(t, pre, "pulls", "source"), "the prefill engine pulled from the source first")
			assert.Positive(t, p2p(t, pre, "blocks_pulled", "source"))
			assert.Equal(t, p2p(t, pre, "blocks_pulled", "source"), p2p(t, r.source.ranks[0], "blocks_served", "source"))
			assert.Equal(t, 1.0, r.sc.Metric(t, "pd_sidecar_kv_sources_total", map[string]string{"outcome": "used"}))
		})
	}
}
