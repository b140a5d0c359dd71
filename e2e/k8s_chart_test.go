//go:build k8s

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/loader"
	helmkube "helm.sh/helm/v4/pkg/kube"
	release "helm.sh/helm/v4/pkg/release/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestK8sChartRBACServiceAccount: the chart, with SSRF protection on, is
// installed with the Helm SDK on the real API server (server-side apply,
// every object accepted, the release deployed), and the decode
// Deployment's pod template — with the sidecar injected as a native
// sidecar (an init container with restartPolicy Always) — is stored as
// written. A sidecar running as the chart's ServiceAccount (a token from
// the TokenRequest API) syncs its watch through the chart's Role and
// admits the pool's Ready pod; with the Role gone, a sidecar exits at once
// naming every missing permission instead of waiting out its sync timeout.
func TestK8sChartRBACServiceAccount(t *testing.T) {
	b := newK8sCluster(t)
	ctx := context.Background()
	values := map[string]any{"sidecar": map[string]any{"flags": map[string]any{
		"enable-ssrf-protection": true, "inference-pool": b.ns + "/pool"}}}
	chart, err := loader.Load(filepath.Join(harness.RepoRoot(t), "deploy", "helm", "pd-sidecar"))
	require.NoError(t, err)
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &b.c.Kubeconfig, &b.ns
	cfg := action.NewConfiguration()
	require.NoError(t, cfg.Init(flags, b.ns, "secret"))
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = "pd", b.ns
	install.WaitStrategy = helmkube.HookOnlyStrategy // no kubelet runs the pods
	rr, err := install.RunWithContext(ctx, chart, values)
	require.NoError(t, err, "helm install against the real API server: every object accepted")
	rel, ok := rr.(*release.Release)
	require.True(t, ok, "a %T", rr)
	require.Equal(t, "deployed", string(rel.Info.Status))

	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(rel.Manifest), 4096)
	var written []*unstructured.Unstructured
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		if len(obj) > 0 {
			written = append(written, &unstructured.Unstructured{Object: obj})
		}
	}
	kinds := map[string]int{}
	for _, u := range written {
		kinds[u.GetKind()]++
	}
	require.Equal(t, map[string]int{"Deployment": 1, "Role": 1, "RoleBinding": 1, "Service": 1, "ServiceAccount": 1}, kinds)

	var sa, role string
	for _, u := range written {
		switch u.GetKind() {
		case "Deployment":
			stored, err := b.c.Client.AppsV1().Deployments(b.ns).Get(ctx, u.GetName(), metav1.GetOptions{})
			require.NoError(t, err)
			want, _, _ := unstructured.NestedMap(u.Object, "spec", "template")
			var got map[string]any
			raw, err := json.Marshal(stored.Spec.Template)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(raw, &got))
			assertSubset(t, "spec.template", want, got)
			var native bool
			for _, c := range stored.Spec.Template.Spec.InitContainers {
				if c.RestartPolicy != nil && string(*c.RestartPolicy) == "Always" && strings.Contains(c.Name, "sidecar") {
					native = true
				}
			}
			assert.True(t, native, "the sidecar stored as a native sidecar (init container, restartPolicy Always)")
		case "ServiceAccount":
			sa = u.GetName()
		case "Role":
			role = u.GetName()
		}
	}
	require.NotEmpty(t, sa)

	tr, err := b.c.Client.CoreV1().ServiceAccounts(b.ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	require.NoError(t, err, "a token for the chart's ServiceAccount")
	kc, err := b.c.WriteKubeconfig("chart-sa", tr.Status.Token)
	require.NoError(t, err)

	b.createPod(t, "prefill-0", map[string]string{"app": "prefill"})
	b.setReady(t, "prefill-0", "127.0.0.2", true)
	b.sc = b.startSidecar(t, kc)
	b.decided(t, "as the chart's ServiceAccount: pod Ready", b.prefill.HostPort(), http.StatusOK)

	require.NoError(t, b.c.Client.RbacV1().Roles(b.ns).Delete(ctx, role, metav1.DeleteOptions{}))
	p := harness.Start(t, harness.Binary(t, "pd-sidecar"), append([]string{"--port", itoa(harness.FreePort(t)),
		"--model-server-port", itoa(b.decode.Port)}, b.sidecarArgs(kc)...)...)
	start := time.Now()
	code, err := p.Wait(20 * time.Second)
	require.NoError(t, err, "exits, not a hang")
	took := time.Since(start)
	assert.NotZero(t, code)
	assert.Less(t, took, 5*time.Second, "fails at once, well before --ssrf-sync-timeout 10s")
	for _, perm := range []string{"list inferencepools.inference.networking.k8s.io", "watch pods", "in namespace " + b.ns} {
		assert.Contains(t, p.Output(), perm, "the message names what is missing")
	}
	t.Logf("without the Role: exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(p.Output()))
}

// assertSubset asserts that every field of want is in got with the same
// value (the API server adds defaults, never changes what was written).
func assertSubset(t *testing.T, path string, want, got any) {
	t.Helper()
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !assert.True(t, ok, "%s: stored as %T", path, got) {
			return
		}
		for k, v := range w {
			assertSubset(t, path+"."+k, v, g[k])
		}
	case []any:
		g, ok := got.([]any)
		if !assert.True(t, ok, "%s: stored as %T", path, got) || !assert.Len(t, g, len(w), path) {
			return
		}
		for i := range w {
			assertSubset(t, path+"["+itoa(i)+"]", w[i], g[i])
		}
	default:
		if strings.Contains(path, ".resources.") { // quantities are stored canonical: 1 as "1"
			wq, werr := resource.ParseQuantity(fmt.Sprint(want))
			gq, gerr := resource.ParseQuantity(fmt.Sprint(got))
			if assert.NoError(t, errors.Join(werr, gerr), path) {
				assert.Zero(t, wq.Cmp(gq), "%s: %v stored as %v", path, want, got)
			}
			return
		}
		wj, _ := json.Marshal(want)
		gj, _ := json.Marshal(got)
		assert.JSONEq(t, string(wj), string(gj), path)
	}
}

func ptr[T any](v T) *T { return &v }
