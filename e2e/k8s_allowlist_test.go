//go:build k8s

package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/e2e/kube"
)

// These tests run against a real API server (make test-k8s: etcd and
// kube-apiserver on loopback, e2e/kube). Loopback addresses stand for pod
// IPs: a prefill engine-sim listens on 127.0.0.2, and the pods the tests
// create say that is their podIP.

var poolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// k8sBed is a cluster with a namespace, an InferencePool selecting
// app=prefill on the prefill engine's port, and a sidecar whose SSRF
// allowlist watches that pool.
type k8sBed struct {
	c               *kube.Cluster
	ns              string
	prefill, decode *harness.Engine
	sc              *harness.Sidecar
}

func newK8sBed(t *testing.T) *k8sBed {
	t.Helper()
	b := newK8sCluster(t)
	b.sc = b.startSidecar(t, b.c.Kubeconfig)
	return b
}

// newK8sCluster is newK8sBed without the sidecar.
func newK8sCluster(t *testing.T) *k8sBed {
	t.Helper()
	b := &k8sBed{c: kube.Start(t, harness.RepoRoot(t)), ns: "pd"}
	ctx := context.Background()
	_, err := b.c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	b.prefill = harness.StartEngineSim(t, "prefill", "--host", "127.0.0.2")
	b.decode = harness.StartEngineSim(t, "decode")
	b.setPool(t, map[string]string{"app": "prefill"}, b.prefill.Port)
	return b
}

// sidecarArgs are the flags of a sidecar watching the pool with kubeconfig.
func (b *k8sBed) sidecarArgs(kubeconfig string) []string {
	return []string{"--enable-ssrf-protection", "--inference-pool", b.ns + "/pool", "--kubeconfig", kubeconfig,
		"--prefill-max-retries", "0", "--ssrf-sync-timeout", "10s"}
}

// startSidecar starts a sidecar watching the pool with kubeconfig.
func (b *k8sBed) startSidecar(t *testing.T, kubeconfig string) *harness.Sidecar {
	t.Helper()
	return harness.StartSidecar(t, b.decode.Port, b.sidecarArgs(kubeconfig)...)
}

// setPool creates or updates the pool.
func (b *k8sBed) setPool(t *testing.T, selector map[string]string, ports ...int) {
	t.Helper()
	ctx := context.Background()
	var tp []any
	for _, p := range ports {
		tp = append(tp, map[string]any{"number": int64(p)})
	}
	sel := map[string]any{}
	for k, v := range selector {
		sel[k] = v
	}
	spec := map[string]any{"selector": map[string]any{"matchLabels": sel}, "targetPorts": tp,
		"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}}}
	ri := b.c.Dynamic.Resource(poolGVR).Namespace(b.ns)
	cur, err := ri.Get(ctx, "pool", metav1.GetOptions{})
	if err != nil {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
			"metadata": map[string]any{"name": "pool", "namespace": b.ns}, "spec": spec}}
		_, err = ri.Create(ctx, u, metav1.CreateOptions{})
		require.NoError(t, err, "the API server accepts the pool")
		return
	}
	cur.Object["spec"] = spec
	_, err = ri.Update(ctx, cur, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// createPod creates pod name with labels (not yet Ready).
func (b *k8sBed) createPod(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	_, err := b.c.Client.CoreV1().Pods(b.ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// setReady sets pod name's status as a kubelet would: Running on ip, and
// its Ready condition.
func (b *k8sBed) setReady(t *testing.T, name, ip string, ready bool) {
	t.Helper()
	ctx := context.Background()
	pods := b.c.Client.CoreV1().Pods(b.ns)
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: metav1.Now()}}}
	_, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
	require.NoError(t, err, "the status subresource takes it")
}

// relabel replaces pod name's labels.
func (b *k8sBed) relabel(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	pods := b.c.Client.CoreV1().Pods(b.ns)
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	p.Labels = labels
	_, err = pods.Update(ctx, p, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// status is the sidecar's answer to a request naming prefiller hp: 403
// when the allowlist refuses it, 200 after a split.
func (b *k8sBed) status(t *testing.T, hp string) int {
	t.Helper()
	code, body, _ := scPost(t, b.sc.URL()+"/v1/completions", completionBody(`,"max_tokens":2`), map[string]string{"x-prefiller-host-port": hp})
	if code != http.StatusOK && code != http.StatusForbidden {
		t.Fatalf("unexpected answer %d: %s", code, body)
	}
	return code
}

// decided waits until a request naming hp gets want, and returns how long
// that took from now (the API change just made); it fails past 10 s.
func (b *k8sBed) decided(t *testing.T, what, hp string, want int) time.Duration {
	t.Helper()
	return b.decidedWithin(t, what, hp, want, 10*time.Second)
}

// reconnect bounds a decision that waits for the sidecar's watches to come
// back after the API server restarted: client-go's reflector retries a
// failed watch with exponential backoff up to 30 s.
const reconnect = 40 * time.Second

// decidedWithin is decided with bound d.
func (b *k8sBed) decidedWithin(t *testing.T, what, hp string, want int, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for b.status(t, hp) != want {
		if time.Since(start) > d {
			t.Fatalf("%s: %s not answered %d within %v", what, hp, want, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("%-48s %s → %d in %v", what, hp, want, took.Round(time.Millisecond))
	return took
}

// TestK8sAllowlistFollowsPods: against the real API server, the sidecar's
// allowlist is the pool's Ready pods on its target ports: a pod turning
// Ready is allowed, NotReady, relabelled out of the selector, on a port the
// pool does not target, or deleted is refused, and a change of the pool's
// selector or ports is followed — each within a bound, logged with the
// time from the API change to the sidecar's decision.
func TestK8sAllowlistFollowsPods(t *testing.T) {
	b := newK8sBed(t)
	hp := b.prefill.HostPort()
	const bound = 5 * time.Second
	prefillLabels := map[string]string{"app": "prefill"}

	b.createPod(t, "prefill-0", prefillLabels)
	require.Equal(t, http.StatusForbidden, b.status(t, hp), "a pod that is not Ready")

	b.setReady(t, "prefill-0", "127.0.0.2", true)
	require.Less(t, b.decided(t, "pod Ready", hp, http.StatusOK), bound)
	require.Equal(t, http.StatusForbidden, b.status(t, "127.0.0.2:1"), "a port the pool does not target")
	require.Positive(t, b.prefill.Metric(t, "vllm:request_success_total", nil), "the split ran on the allowed pod")

	b.setReady(t, "prefill-0", "127.0.0.2", false)
	require.Less(t, b.decided(t, "pod NotReady", hp, http.StatusForbidden), bound)
	b.setReady(t, "prefill-0", "127.0.0.2", true)
	require.Less(t, b.decided(t, "pod Ready again", hp, http.StatusOK), bound)

	b.relabel(t, "prefill-0", map[string]string{"app": "other"})
	require.Less(t, b.decided(t, "pod relabelled out of the selector", hp, http.StatusForbidden), bound)
	b.setPool(t, map[string]string{"app": "other"}, b.prefill.Port)
	require.Less(t, b.decided(t, "pool selector changed to match it", hp, http.StatusOK), bound)

	b.setPool(t, map[string]string{"app": "other"}, b.prefill.Port+1)
	require.Less(t, b.decided(t, "pool target port changed away", hp, http.StatusForbidden), bound)
	b.setPool(t, map[string]string{"app": "other"}, b.prefill.Port+1, b.prefill.Port)
	require.Less(t, b.decided(t, "pool target ports include it again", hp, http.StatusOK), bound)

	require.NoError(t, b.c.Client.CoreV1().Pods(b.ns).Delete(context.Background(), "prefill-0", metav1.DeleteOptions{}))
	require.Less(t, b.decided(t, "pod deleted", hp, http.StatusForbidden), bound)
	require.Positive(t, b.sc.Metric(t, "pd_sidecar_requests_rejected_total", map[string]string{"reason": "prefiller_not_allowed"}),
		"refusals counted")
	require.Contains(t, b.sc.Output(), "prefiller not on the allowlist", "refusals logged")
}

// TestK8sAllowlistSurvivesServerRestartAndCompaction: with the API server
// down, requests are decided on the last good set; a change made while the
// sidecar's watch was away, with etcd compacted past its resource version
// (a 410 Gone on resuming), is picked up by a relist once the server is
// back and the watch's backoff let it reconnect, without restarting the
// sidecar. Deleting the pool refuses every prefiller (fail closed).
func TestK8sAllowlistSurvivesServerRestartAndCompaction(t *testing.T) {
	b := newK8sBed(t)
	hp := b.prefill.HostPort()
	b.createPod(t, "prefill-0", map[string]string{"app": "prefill"})
	b.setReady(t, "prefill-0", "127.0.0.2", true)
	b.decided(t, "pod Ready", hp, http.StatusOK)
	require.Equal(t, 1.0, b.sc.Metric(t, "pd_sidecar_inference_pool_allowed", nil))
	require.Equal(t, 1.0, b.sc.Metric(t, "pd_sidecar_inference_pool_found", nil))
	require.Positive(t, b.sc.Metric(t, "pd_sidecar_inference_pool_events_total", map[string]string{"resource": "pods"}))

	pod, err := b.c.Client.CoreV1().Pods(b.ns).Get(context.Background(), "prefill-0", metav1.GetOptions{})
	require.NoError(t, err)
	seen := pod.ResourceVersion // what the sidecar's watch has seen, at most

	b.c.StopServer()
	down := time.Now()
	for time.Since(down) < 3*time.Second {
		require.Equal(t, http.StatusOK, b.status(t, hp), "decided on the last good set while the API server is down")
		time.Sleep(100 * time.Millisecond)
	}
	resp, err := http.Get(b.sc.URL() + "/ready")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "/ready while the API server is down")
	require.Equal(t, 1.0, b.sc.Metric(t, "pd_sidecar_inference_pool_allowed", nil), "the last set kept")
	require.NoError(t, b.c.StartServer())
	// While the sidecar's watch is still away: the pod goes NotReady, and
	// enough writes follow that a compaction passes its resource version.
	b.setReady(t, "prefill-0", "127.0.0.2", false)
	for i := range 20 {
		b.createPod(t, "filler-"+itoa(i), map[string]string{"app": "filler"})
	}
	require.NoError(t, b.c.Compact(context.Background()))
	// A watch resumed from what the sidecar saw is now refused: 410 Gone.
	w, err := b.c.Client.CoreV1().Pods(b.ns).Watch(context.Background(), metav1.ListOptions{ResourceVersion: seen})
	require.NoError(t, err)
	ev := <-w.ResultChan()
	w.Stop()
	require.Equal(t, watch.Error, ev.Type, "resuming from %s after the compaction", seen)
	st, ok := ev.Object.(*metav1.Status)
	require.True(t, ok)
	require.Equal(t, int32(http.StatusGone), st.Code, "410 Gone: %s", st.Message)
	b.decidedWithin(t, "NotReady while away, after compaction", hp, http.StatusForbidden, reconnect)

	b.setReady(t, "prefill-0", "127.0.0.2", true)
	b.decided(t, "Ready after the relist", hp, http.StatusOK)

	require.NoError(t, b.c.Dynamic.Resource(poolGVR).Namespace(b.ns).Delete(context.Background(), "pool", metav1.DeleteOptions{}))
	b.decidedWithin(t, "pool deleted: fail closed", hp, http.StatusForbidden, reconnect)
	require.Zero(t, b.sc.Metric(t, "pd_sidecar_inference_pool_found", nil), "fail closed, shown")
	require.Zero(t, b.sc.Metric(t, "pd_sidecar_inference_pool_allowed", nil))
	harness.Eventually(t, 5*time.Second, "the fail-closed state logged", func() bool {
		return strings.Contains(b.sc.Output(), "inference pool not found")
	})
}
