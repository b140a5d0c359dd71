package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// llmdDeploymentArgs are the sidecar arg lists of llm-d's own manifests,
// verbatim (llm-d-router v0.10's deployment manifests; ${VLLM_DATA_PARALLEL_SIZE} = 1,
// ${CONNECTOR_TYPE} as llm-d's e2e substitutes it). The lists that turn on
// a feature not built here yet are refused at start-up, as cmd/pd-sidecar's
// TestLLMDDeploymentArgs checks. The e-pd and e-p-d lists (--ec-connector)
// serve a text split here, and their encoder stage is proven by
// TestEncoderStageECExample; the MoRI-IO lists are run by
// TestMoriIOLLMDArgListsServeASplit.
var llmdDeploymentArgs = []struct {
	name, connector, args string
}{
	{"vllm-decode", "nixlv2", "--port=8000 --secure-proxy=false --data-parallel-size=1"},
	{"p-d nixlv2", "nixlv2", "--port=8000 --kv-connector=nixlv2 --mooncake-bootstrap-port=8000 --secure-proxy=false --data-parallel-size=1"},
	{"p-d shared-storage", "shared-storage", "--port=8000 --kv-connector=shared-storage --mooncake-bootstrap-port=8000 --secure-proxy=false --data-parallel-size=1"},
	{"p-d mooncake", "mooncake", "--port=8000 --kv-connector=mooncake --mooncake-bootstrap-port=8000 --secure-proxy=false --data-parallel-size=1"},
	{"test pod-qwen", "nixlv2", "--port=8000 --model-server-port=8001"},
	{"e-pd", "nixlv2", "--port=8000 --ec-connector=ec-example --secure-proxy=false --data-parallel-size=1"},
	{"e-p-d", "shared-storage", "--port=8000 --kv-connector=shared-storage --ec-connector=ec-example --secure-proxy=false --data-parallel-size=1"},
	// What llm-d-modelservice renders, its default list included, is run by
	// TestModelserviceArgListsServeASplit from the chart's fixture.
}

// TestLLMDDeploymentArgsServeASplit starts pd-sidecar with each of llm-d's
// deployment arg lists, only the ports changed to the test's (the engines
// listen where the test put them), and proves one split by the engines'
// counters.
func TestLLMDDeploymentArgsServeASplit(t *testing.T) {
	for _, tc := range llmdDeploymentArgs {
		t.Run(tc.name, func(t *testing.T) {
			spec := connSpec{name: "nixlv2", prefillProof: "sim_remote_decode_prefills_total", decodeProof: "sim_remote_kv_decodes_total"}
			for _, s := range connSpecs {
				if s.name == tc.connector {
					spec = s
				}
			}
			var engineFlags []string
			if spec.name == "shared-storage" {
				engineFlags = append(engineFlags, "--shared-storage-dir", t.TempDir())
			}
			prefill := harness.StartEngineSim(t, "prefill", engineFlags...)
			decode := harness.StartEngineSim(t, "decode", engineFlags...)
			var args []string
			for _, a := range strings.Fields(tc.args) {
				switch {
				case strings.HasPrefix(a, "--port="), strings.HasPrefix(a, "--model-server-port="), strings.HasPrefix(a, "--vllm-port="):
					// The harness gives the sidecar's and the engine's ports.
				case strings.HasPrefix(a, "--mooncake-bootstrap-port=") && spec.name == "mooncake":
					args = append(args, "--mooncake-bootstrap-port="+itoa(prefill.BootstrapPort))
				default:
					args = append(args, a)
				}
			}
			sc := harness.StartSidecar(t, decode.Port, args...)
			body := completionBody(`,"max_tokens":5` + spec.extra)
			st, got, _ := scPost(t, sc.URL()+"/v1/completions", body, map[string]string{"x-prefiller-host-port": prefill.HostPort()})
			require.Equal(t, http.StatusOK, st, "%s", got)
			assert.Positive(t, prefill.Metric(t, spec.prefillProof, nil), "the prefiller did the prefill")
			assert.Positive(t, decode.Metric(t, spec.decodeProof, nil), "the decoder decoded on its KV")
			assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_requests_total", map[string]string{"mode": "disaggregated", "code": "200"}))
		})
	}
}
