package e2e

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

// Every NIXL prefill answer of the upstream corpus splits end to end: both
// engine simulators speak the shape (--wire-shape: the prefill writes
// exactly its members, the decode refuses params that lack one its decode
// side reads), on both serving paths. What proves the split is on the
// engines: the prefiller held blocks for a remote decoder, the decoder
// decoded on KV it pulled (for llm-d-inference-sim's placeholders: skipped
// the prefill with nothing to pull, as that simulator does), its answer is
// the local run's, and no fallback was counted.

// TestCorpusShapesSplit runs each shape, the newest and the oldest among
// them, through a sidecar on the lane and on fasthttp's path.
func TestCorpusShapesSplit(t *testing.T) {
	shapes, err := wirecorpus.Select("nixlv2", wirecorpus.PrefillAnswer)
	require.NoError(t, err)
	names := map[string]bool{}
	for _, s := range shapes {
		names[s.Name] = true
	}
	for _, want := range []string{"vllm-nixl-pull-0050936b", "vllm-nixl-push-0316d25a", "vllm-nixl-single-file-v1", "llm-d-inference-sim-eec055a3"} {
		require.True(t, names[want], "the corpus has %s", want)
	}
	prompt := strings.Repeat("the corpus is the authority on the wire ", 12)
	body := `{"model":"sim-model","prompt":"` + prompt + `","max_tokens":6}`
	for _, s := range shapes {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			shape := []string{"--wire-shape", s.Name}
			prefill := harness.StartEngineSim(t, "prefill", shape...)
			decode := harness.StartEngineSim(t, "decode", shape...)
			_, local, _ := scPost(t, decode.URL()+"/v1/completions", body, nil)
			placeholder := s.Engine == "llm-d-inference-sim"
			for _, mode := range serveModes {
				sc := harness.StartSidecar(t, decode.Port, mode.flags...)
				before := shapeCounts(t, prefill, decode)
				st, answer, _ := scPost(t, sc.URL()+"/v1/completions", body, map[string]string{"x-prefiller-host-port": prefill.HostPort()})
				require.Equal(t, 200, st, "%s: %s", mode.name, answer)
				after := shapeCounts(t, prefill, decode)
				assert.Equal(t, textOf(local), textOf(answer), "%s: the answer is the local run's", mode.name)
				assert.Equal(t, 1.0, after.prefills-before.prefills, "%s: the prefiller prefilled for a remote decoder", mode.name)
				if placeholder {
					assert.Equal(t, 1.0, after.placeholders-before.placeholders, "%s: the decoder took the placeholders", mode.name)
				} else {
					assert.Equal(t, 1.0, after.pulled-before.pulled, "%s: the decoder decoded on pulled KV", mode.name)
				}
				assert.Zero(t, after.invalid-before.invalid, "%s: the decoder found every member it reads", mode.name)
				assert.Zero(t, sc.Metric(t, "pd_sidecar_fallbacks_total", nil), "%s: no fallback", mode.name)
				assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated"}), mode.name)
				assert.Zero(t, sc.Metric(t, "pd_sidecar_kv_params_unknown_members_total", nil), "%s: every member is documented", mode.name)
			}
		})
	}
}

// shapeCounts are the engines' proof counters of a split.
type shapeCount struct{ prefills, pulled, placeholders, invalid float64 }

func shapeCounts(t *testing.T, prefill, decode *harness.Engine) shapeCount {
	t.Helper()
	return shapeCount{
		prefills:     prefill.Metric(t, "sim_remote_decode_prefills_total", nil),
		pulled:       decode.Metric(t, "sim_remote_kv_decodes_total", nil),
		placeholders: decode.Metric(t, "sim_placeholder_kv_decodes_total", nil),
		invalid:      decode.Metric(t, "sim_invalid_kv_params_total", nil),
	}
}

// TestParallelLayoutReachesTheDecoder: a prefill engine of decode-context
// parallel 2 and pipeline parallel 2 names its layout; the decode engine
// receives dcp_size 2 and pp_size 2 unchanged, on both paths.
func TestParallelLayoutReachesTheDecoder(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill", "--dcp-size", "2", "--pp-size", "2")
	decode := harness.StartEngineSim(t, "decode")
	body := completionBody(`,"max_tokens":4`)
	for i, mode := range serveModes {
		sc := harness.StartSidecar(t, decode.Port, mode.flags...)
		st, answer, _ := scPost(t, sc.URL()+"/v1/completions", body, map[string]string{"x-prefiller-host-port": prefill.HostPort()})
		require.Equal(t, 200, st, "%s: %s", mode.name, answer)
		assert.Equal(t, float64(i+1), decode.Metric(t, "sim_remote_kv_layouts_total", map[string]string{"tp_size": "1", "dcp_size": "2", "pp_size": "2"}),
			"%s: the decode engine read the prefill engine's layout", mode.name)
	}
}

// TestSGLangIPv6Prefiller: an SGLang prefiller on an IPv6 address splits:
// bootstrap_host goes bracketed, as SGLang's mini_lb writes it, and the
// decode engine, which joins f"{bootstrap_host}:{bootstrap_port}" as
// SGLang's decode does, reaches the prefiller's bootstrap server.
func TestSGLangIPv6Prefiller(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill", "--host", "::1")
	decode := harness.StartEngineSim(t, "decode")
	body := completionBody(`,"max_tokens":5`)
	_, local, _ := scPost(t, decode.URL()+"/v1/completions", body, nil)
	for i, mode := range serveModes {
		sc := harness.StartSidecar(t, decode.Port, append([]string{"--kv-connector", "sglang", "--sglang-bootstrap-port", itoa(prefill.BootstrapPort)}, mode.flags...)...)
		st, b, _ := scPost(t, sc.URL()+"/v1/completions", body, map[string]string{"x-prefiller-host-port": prefill.HostPort()})
		require.Equal(t, 200, st, "%s: %s", mode.name, b)
		assert.Equal(t, textOf(local), textOf(b), mode.name)
		assert.Equal(t, float64(i+1), decode.Metric(t, "sim_sglang_decodes_total", nil), "%s: the decode pulled the room's KV", mode.name)
		reqs := simRequests(t, decode)
		assert.Equal(t, "[::1]", gjson.GetBytes(reqs[len(reqs)-1].Body, "bootstrap_host").Str, mode.name)
	}
}

// TestMooncakeDataParallelPrefiller: a Mooncake prefill engine of two
// data-parallel ranks answers GET /query with one engine id each, as vLLM
// does; each split names its rank on the prefill leg (X-data-parallel-rank,
// the client's own never passed on) and gives the decode leg that rank's
// engine id, so every decode finds its transfer, on both paths.
func TestMooncakeDataParallelPrefiller(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill", "--mooncake-dp-ranks", "2")
	decode := harness.StartEngineSim(t, "decode", "--bootstrap-timeout", "3s")
	const n = 24 // the rank follows a random bootstrap room: both ranks seen but for a 2^-23 chance
	for i, mode := range serveModes {
		sc := harness.StartSidecar(t, decode.Port, append([]string{"--kv-connector", "mooncake", "--mooncake-bootstrap-port", itoa(prefill.BootstrapPort)}, mode.flags...)...)
		seen := len(simRequests(t, prefill))
		for j := range n {
			body := `{"model":"sim-model","prompt":` + quote(simPrompt+" "+itoa(j)) + `,"max_tokens":4}`
			st, b, _ := scPost(t, sc.URL()+"/v1/completions", body, map[string]string{"x-prefiller-host-port": prefill.HostPort(), "X-Data-Parallel-Rank": "7"})
			require.Equal(t, 200, st, "%s: %s", mode.name, b)
		}
		assert.Equal(t, float64((i+1)*n), decode.Metric(t, "sim_mooncake_decodes_total", nil), "%s: every decode found its transfer", mode.name)
		assert.Zero(t, sc.Metric(t, "pd_sidecar_fallbacks_total", nil), mode.name)
		ranks := map[string]int{}
		for _, r := range simRequests(t, prefill)[seen:] {
			require.Len(t, r.Headers["x-data-parallel-rank"], 1, "%s: one rank header", mode.name)
			ranks[r.Headers["x-data-parallel-rank"][0]]++
		}
		assert.Equal(t, n, ranks["0"]+ranks["1"], "%s: every prefill leg names rank 0 or 1, never the client's 7: %v", mode.name, ranks)
		assert.Positive(t, ranks["0"], mode.name)
		assert.Positive(t, ranks["1"], mode.name)
	}
}
