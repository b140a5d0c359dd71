package rendertest_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest"
	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

func TestPlainManifests(t *testing.T) {
	o, err := rendertest.DecodeFiles("../manifests")
	require.NoError(t, err)
	require.Len(t, o.Deployments, 2)
	require.Equal(t, 1, o.Kinds["InferencePool"])
	var decode, prefill *corev1.PodSpec
	for i := range o.Deployments {
		d := &o.Deployments[i]
		switch d.Spec.Template.Labels["llm-d.ai/role"] {
		case "decode":
			decode = &d.Spec.Template.Spec
		case "prefill":
			prefill = &d.Spec.Template.Spec
		}
		assert.Equal(t, d.Spec.Selector.MatchLabels["app.kubernetes.io/name"], d.Spec.Template.Labels["app.kubernetes.io/name"])
	}
	require.NotNil(t, decode)
	require.NotNil(t, prefill)
	c := sidecarOf(t, *decode)
	assertHardened(t, c, corev1.URISchemeHTTP)
	gmp := envNamed(t, c, "GOMAXPROCS")
	require.NotNil(t, gmp.ValueFrom)
	require.NotNil(t, gmp.ValueFrom.ResourceFieldRef)
	assert.Equal(t, "requests.cpu", gmp.ValueFrom.ResourceFieldRef.Resource, "GOMAXPROCS from the CPU request")
	assert.Equal(t, "fail", engineKVConfig(t, decode.Containers[0])["kv_load_failure_policy"])
	assert.Equal(t, "fail", engineKVConfig(t, prefill.Containers[0])["kv_load_failure_policy"])
	assert.Empty(t, prefill.InitContainers, "no sidecar on prefill pods")

	// The real binary parses the sidecar's arguments (a trailing --help
	// stops it after parsing everything before it).
	out, err := exec.Command(harness.Binary(t, "pd-sidecar"), append(c.Args, "--help")...).CombinedOutput()
	require.NoError(t, err, "%s", out)

	pool := o.Other[0]
	assert.Equal(t, "inference.networking.k8s.io/v1", pool["apiVersion"])
	var sel map[string]string
	require.NoError(t, rendertest.Sub(pool, &sel, "spec", "selector", "matchLabels"))
	for _, d := range o.Deployments {
		for k, v := range sel {
			assert.Equal(t, v, d.Spec.Template.Labels[k], "the pool selects %s", d.Name)
		}
	}
	port, _ := portNamed(c, "http")
	var target []map[string]int32
	require.NoError(t, rendertest.Sub(pool, &target, "spec", "targetPorts"))
	assert.Equal(t, port, target[0]["number"], "the pool targets the sidecar's port")
}

// TestModelserviceFragment checks the llm-d modelservice values fragment:
// valid YAML naming our image, the engine's failure policy "fail", and
// the connector flag modelservice passes is one pd-sidecar accepts.
func TestModelserviceFragment(t *testing.T) {
	b, err := os.ReadFile("../helm/llm-d-modelservice-values.yaml")
	require.NoError(t, err)
	var v struct {
		Routing struct {
			ServicePort int `json:"servicePort"`
			Proxy       struct {
				Image      string `json:"image"`
				TargetPort int    `json:"targetPort"`
				Connector  string `json:"connector"`
				DebugLevel int    `json:"debugLevel"`
			} `json:"proxy"`
		} `json:"routing"`
		Decode struct {
			Containers []struct {
				Args []string `json:"args"`
			} `json:"containers"`
		} `json:"decode"`
	}
	require.NoError(t, yaml.Unmarshal(b, &v))
	assert.True(t, strings.HasPrefix(v.Routing.Proxy.Image, "ghcr.io/pd-sidecar/pd-sidecar:"))
	args := v.Decode.Containers[0].Args
	i := indexOf(args, "--kv-transfer-config")
	require.GreaterOrEqual(t, i, 0)
	assert.Contains(t, args[i+1], `"kv_load_failure_policy":"fail"`)
	// What modelservice's routing-proxy template renders from these values.
	rendered := []string{
		"--port=" + itoa(v.Routing.ServicePort), "--vllm-port=" + itoa(v.Routing.Proxy.TargetPort),
		"--connector=" + v.Routing.Proxy.Connector, "-v=" + itoa(v.Routing.Proxy.DebugLevel), "--help",
	}
	out, err := exec.Command(harness.Binary(t, "pd-sidecar"), rendered...).CombinedOutput()
	require.NoError(t, err, "%s", out)
}

func indexOf(s []string, v string) int {
	for i, e := range s {
		if e == v {
			return i
		}
	}
	return -1
}

func itoa(i int) string { return strconv.Itoa(i) }
