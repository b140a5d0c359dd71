package rendertest_test

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

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
