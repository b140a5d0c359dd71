package ssrf

import (
	"context"
	"fmt"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/cache"
)

// pod builds a pod as the dynamic client serves it.
func pod(name, ip string, ready bool, lbl map[string]string) *unstructured.Unstructured {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: lbl},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}},
		},
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		panic(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func poolV1(ports ...int64) *unstructured.Unstructured {
	var tp []any
	for _, p := range ports {
		tp = append(tp, map[string]any{"number": p})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": GroupV1 + "/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "pool", "namespace": "ns"},
		"spec": map[string]any{
			"selector":    map[string]any{"matchLabels": map[string]any{"app": "prefill"}},
			"targetPorts": tp,
		},
	}}
}

func poolV1Alpha2(port int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": GroupV1Alpha2 + "/v1alpha2", "kind": "InferencePool",
		"metadata": map[string]any{"name": "pool", "namespace": "ns"},
		"spec": map[string]any{
			"selector":         map[string]any{"app": "prefill"},
			"targetPortNumber": port,
		},
	}}
}

type rig struct {
	w   *PoolWatcher
	dyn *dynfake.FakeDynamicClient
	gvr schema.GroupVersionResource
}

// fakeDynamic serves pools and pods.
func fakeDynamic(gvr schema.GroupVersionResource, objs ...runtime.Object) *dynfake.FakeDynamicClient {
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gvr: "InferencePoolList", PodsGVR: "PodList"}, objs...)
}

func startWatcher(t *testing.T, group string, pool *unstructured.Unstructured, pods ...*unstructured.Unstructured) *rig {
	t.Helper()
	return startObserved(t, nil, group, pool, pods...)
}

// startObserved is startWatcher with obs (nil: none) observing the watcher
// from its start.
func startObserved(t *testing.T, obs WatchObserver, group string, pool *unstructured.Unstructured, pods ...*unstructured.Unstructured) *rig {
	t.Helper()
	cfg := PoolConfig{Namespace: "ns", Name: "pool", Group: group}
	gvr := cfg.GVR()
	var objs []runtime.Object
	if pool != nil {
		objs = append(objs, pool)
	}
	for _, p := range pods {
		objs = append(objs, p)
	}
	dyn := fakeDynamic(gvr, objs...)
	w, err := NewPoolWatcher(cfg, dyn, zerolog.Nop())
	require.NoError(t, err)
	if obs != nil {
		w.Observe(obs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, ready) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("pool watcher did not sync")
	}
	return &rig{w: w, dyn: dyn, gvr: gvr}
}

// noLeaks checks, after every other cleanup ran, that no goroutine is left.
func noLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 30*time.Second, 5*time.Millisecond, what)
}

func TestPoolWatcherReadyPodsOnTargetPorts(t *testing.T) {
	noLeaks(t)
	app := map[string]string{"app": "prefill"}
	r := startWatcher(t, GroupV1, poolV1(8000, 8001),
		pod("p0", "10.0.0.1", true, app),
		pod("p1", "10.0.0.2", false, app),                                  // not Ready
		pod("other", "10.0.0.3", true, map[string]string{"app": "decode"}), // not in the pool
	)
	cases := []struct {
		hp   string
		want bool
	}{
		{"10.0.0.1:8000", true},
		{"10.0.0.1:8001", true},
		{"10.0.0.1:22", false}, // llm-d would admit any port of a pool pod
		{"10.0.0.2:8000", false},
		{"10.0.0.3:8000", false},
		{"pod-name:8000", false},
		{"[::ffff:10.0.0.1]:8000", true},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, r.w.Allowed(c.hp), c.hp)
	}
	assert.Equal(t, 2, r.w.Len())

	ctx := context.Background()
	pods := r.dyn.Resource(PodsGVR).Namespace("ns")
	// p1 turns Ready: admitted.
	_, err := pods.UpdateStatus(ctx, pod("p1", "10.0.0.2", true, app), metav1.UpdateOptions{})
	require.NoError(t, err)
	eventually(t, "p1 admitted once Ready", func() bool { return r.w.Allowed("10.0.0.2:8000") })
	// p0 loses readiness: denied.
	_, err = pods.UpdateStatus(ctx, pod("p0", "10.0.0.1", false, app), metav1.UpdateOptions{})
	require.NoError(t, err)
	eventually(t, "p0 denied once not Ready", func() bool { return !r.w.Allowed("10.0.0.1:8000") })
	// A new Ready pod.
	_, err = pods.Create(ctx, pod("p2", "10.0.0.9", true, app), metav1.CreateOptions{})
	require.NoError(t, err)
	eventually(t, "new pod admitted", func() bool { return r.w.Allowed("10.0.0.9:8001") })
	// Deleted pod: denied.
	require.NoError(t, pods.Delete(ctx, "p2", metav1.DeleteOptions{}))
	eventually(t, "deleted pod denied", func() bool { return !r.w.Allowed("10.0.0.9:8001") })
	// The pool's target ports change.
	_, err = r.dyn.Resource(r.gvr).Namespace("ns").Update(ctx, poolV1(9000), metav1.UpdateOptions{})
	require.NoError(t, err)
	eventually(t, "new target port", func() bool {
		return r.w.Allowed("10.0.0.2:9000") && !r.w.Allowed("10.0.0.2:8000")
	})
	// The pool is deleted: nothing is allowed.
	require.NoError(t, r.dyn.Resource(r.gvr).Namespace("ns").Delete(ctx, "pool", metav1.DeleteOptions{}))
	eventually(t, "pool gone: nothing allowed", func() bool { return r.w.Len() == 0 })
}

func TestPoolWatcherV1Alpha2(t *testing.T) {
	noLeaks(t)
	r := startWatcher(t, GroupV1Alpha2, poolV1Alpha2(8200),
		pod("p0", "10.0.0.1", true, map[string]string{"app": "prefill"}))
	assert.True(t, r.w.Allowed("10.0.0.1:8200"))
	assert.False(t, r.w.Allowed("10.0.0.1:8000"))
}

func TestPoolWatcherWithoutPoolAllowsNothing(t *testing.T) {
	noLeaks(t)
	r := startWatcher(t, GroupV1, nil, pod("p0", "10.0.0.1", true, map[string]string{"app": "prefill"}))
	assert.False(t, r.w.Allowed("10.0.0.1:8000"))
	_, err := r.dyn.Resource(r.gvr).Namespace("ns").Create(context.Background(), poolV1(8000), metav1.CreateOptions{})
	require.NoError(t, err)
	eventually(t, "pool created", func() bool { return r.w.Allowed("10.0.0.1:8000") })
}

func TestPoolWatcherBadSpecAllowsNothing(t *testing.T) {
	noLeaks(t)
	bad := poolV1()
	r := startWatcher(t, GroupV1, bad, pod("p0", "10.0.0.1", true, map[string]string{"app": "prefill"}))
	assert.Zero(t, r.w.Len())
}

func TestPoolWatcherNotSynced(t *testing.T) {
	noLeaks(t)
	cfg := PoolConfig{Namespace: "ns", Name: "pool", Group: GroupV1}
	w, err := NewPoolWatcher(cfg, fakeDynamic(cfg.GVR()), zerolog.Nop())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, w.Run(ctx, nil), ErrPoolNotSynced)
}

// publishes records every allowlist a watcher publishes (WatchObserver).
type publishes struct {
	mu    sync.Mutex
	sizes []int
}

func (p *publishes) Event(string) {}
func (p *publishes) Allowlist(allowed int, _ bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sizes = append(p.sizes, allowed)
}

func (p *publishes) since(i int) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.sizes[i:]...)
}

// TestPoolWatcherSelectorSwitchOver: the pool's selector changes from the
// pods of one app to those of another. Every allowlist published from the
// change on is the old app's pod alone, until the new selector's watch has
// synced, then the new app's pod alone: never empty, never both.
func TestPoolWatcherSelectorSwitchOver(t *testing.T) {
	noLeaks(t)
	obs := &publishes{}
	r := startObserved(t, obs, GroupV1, poolV1(8000),
		pod("old", "10.0.0.1", true, map[string]string{"app": "prefill"}),
		pod("new", "10.0.0.2", true, map[string]string{"app": "prefill-v2"}))
	w, ctx := r.w, context.Background()
	require.True(t, w.Allowed("10.0.0.1:8000"))
	require.False(t, w.Allowed("10.0.0.2:8000"))
	from := len(obs.since(0))

	moved := poolV1(8000)
	require.NoError(t, unstructured.SetNestedStringMap(moved.Object, map[string]string{"app": "prefill-v2"}, "spec", "selector", "matchLabels"))
	_, err := r.dyn.Resource(r.gvr).Namespace("ns").Update(ctx, moved, metav1.UpdateOptions{})
	require.NoError(t, err)
	eventually(t, "the new selector's pod admitted", func() bool { return w.Allowed("10.0.0.2:8000") })
	assert.False(t, w.Allowed("10.0.0.1:8000"), "the old selector's pod no longer")
	for i, n := range obs.since(from) {
		assert.Equal(t, 1, n, "publish %d from the change on: one pod, never none, never both", i)
	}
}

// TestSlimPod: a cached pod keeps what the allowlist reads and nothing of
// its spec, managed fields, annotations or other conditions.
func TestSlimPod(t *testing.T) {
	full := pod("p", "10.0.0.1", true, map[string]string{"app": "prefill", RoleLabel: "prefill"})
	full.SetAnnotations(map[string]string{"big": strings.Repeat("x", 4096)})
	full.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}})
	require.NoError(t, unstructured.SetNestedField(full.Object, "node-1", "spec", "nodeName"))
	require.NoError(t, unstructured.SetNestedSlice(full.Object, []any{
		map[string]any{"type": "PodScheduled", "status": "True"},
		map[string]any{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
	}, "status", "conditions"))
	require.NoError(t, unstructured.SetNestedSlice(full.Object, []any{map[string]any{"ip": "10.0.0.1"}, map[string]any{"ip": "fd00::1"}}, "status", "podIPs"))
	got, err := slimPod(full)
	require.NoError(t, err)
	slim := got.(*unstructured.Unstructured)
	assert.True(t, podReady(slim))
	assert.Len(t, podIPs(slim), 2)
	assert.Equal(t, "prefill", slim.GetLabels()[RoleLabel])
	assert.Empty(t, slim.GetAnnotations())
	assert.Empty(t, slim.GetManagedFields())
	_, hasSpec := slim.Object["spec"]
	assert.False(t, hasSpec)
	conds, _, _ := unstructured.NestedSlice(slim.Object, "status", "conditions")
	assert.Equal(t, []any{map[string]any{"type": "Ready", "status": "True"}}, conds)
	other := "not a pod"
	same, err := slimPod(other)
	require.NoError(t, err)
	assert.Equal(t, other, same)
}

// vllmPod is a pod of a vLLM prefill deployment as the API server serves
// it: spec, managed fields, container statuses and all conditions.
func vllmPod(i int) *unstructured.Unstructured {
	p := pod(fmt.Sprintf("vllm-prefill-%d", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250), true,
		map[string]string{"app": "prefill", RoleLabel: "prefill", "pod-template-hash": "7d9f8c6b5"})
	spec := map[string]any{
		"nodeName": "gpu-node-7", "serviceAccountName": "vllm", "restartPolicy": "Always",
		"containers": []any{
			map[string]any{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
				"args": []any{"--model", "meta-llama/Llama-3.1-70B-Instruct", "--port", "8000", "--tensor-parallel-size", "4",
					"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`},
				"env":       []any{map[string]any{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "status.podIP"}}}},
				"resources": map[string]any{"limits": map[string]any{"nvidia.com/gpu": "4"}, "requests": map[string]any{"cpu": "16", "memory": "256Gi"}},
				"ports":     []any{map[string]any{"containerPort": int64(8000), "protocol": "TCP"}},
				"volumeMounts": []any{map[string]any{"name": "shm", "mountPath": "/dev/shm"},
					map[string]any{"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}},
			},
		},
		"volumes": []any{map[string]any{"name": "shm", "emptyDir": map[string]any{"medium": "Memory", "sizeLimit": "20Gi"}}},
		"tolerations": []any{map[string]any{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
			map[string]any{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": int64(300)}},
	}
	_ = unstructured.SetNestedField(p.Object, spec, "spec")
	_ = unstructured.SetNestedSlice(p.Object, []any{
		map[string]any{"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "2026-12-01T10:00:00Z"},
		map[string]any{"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-01T10:00:00Z"},
		map[string]any{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T10:04:00Z"},
		map[string]any{"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-12-01T10:04:00Z"},
		map[string]any{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T09:59:00Z"},
	}, "status", "conditions")
	_ = unstructured.SetNestedSlice(p.Object, []any{map[string]any{"name": "vllm", "ready": true, "restartCount": int64(0),
		"image": "vllm/vllm-openai:v0.11.0", "imageID": "docker.io/vllm/vllm-openai@sha256:" + strings.Repeat("ab", 32),
		"containerID": "containerd://" + strings.Repeat("cd", 32), "started": true,
		"state": map[string]any{"running": map[string]any{"startedAt": "2026-12-01T10:00:30Z"}}}}, "status", "containerStatuses")
	p.SetManagedFields([]metav1.ManagedFieldsEntry{
		{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:llm-d.ai/role":{},"f:pod-template-hash":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"1\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"vllm\"}":{".":{},"f:args":{},"f:env":{},"f:image":{},"f:name":{},"f:ports":{},"f:resources":{}}}}}`)},
		{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1", Subresource: "status",
			FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:conditions":{"k:{\"type\":\"ContainersReady\"}":{".":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Ready\"}":{".":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}}},"f:containerStatuses":{},"f:podIP":{},"f:podIPs":{}}}`)},
	})
	return p
}

// TestSlimPodCacheBytes: what the informer's cache holds for each pool pod,
// a vLLM pod as the API server serves it, with the transform and without:
// the heap the cached objects keep, measured after a GC (also the JSON
// each is served as, for scale).
func TestSlimPodCacheBytes(t *testing.T) {
	const n = 500
	held := func(slim bool) float64 {
		store := cache.NewStore(cache.MetaNamespaceKeyFunc)
		var before, after goruntime.MemStats
		goruntime.GC()
		goruntime.ReadMemStats(&before)
		for i := range n {
			var obj any = vllmPod(i)
			if slim {
				obj, _ = slimPod(obj)
			}
			require.NoError(t, store.Add(obj))
		}
		goruntime.GC()
		goruntime.ReadMemStats(&after)
		require.Len(t, store.List(), n)
		goruntime.KeepAlive(store)
		return float64(after.HeapAlloc-before.HeapAlloc) / n
	}
	full, slim := held(false), held(true)
	js, err := vllmPod(0).MarshalJSON()
	require.NoError(t, err)
	t.Logf("a vLLM pool pod (%d bytes of JSON) holds %.0f bytes of heap in the cache whole, %.0f reduced (%.0f%%)", len(js), full, slim, 100*slim/full)
	assert.Less(t, slim, full/3, "the reduced pod costs under a third of the whole one")
}
