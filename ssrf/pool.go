package ssrf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// PodsGVR is the core pods resource, watched through the dynamic client:
// client-go's typed clientset and informer factory register every API group
// at start-up (about 10 MiB of RSS and 22 MB of binary) for one resource.
var PodsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// InferencePool API groups.
const (
	// GroupV1 is the GA Gateway API Inference Extension group (v1).
	GroupV1 = "inference.networking.k8s.io"
	// GroupV1Alpha2 is the experimental group (v1alpha2).
	GroupV1Alpha2 = "inference.networking.x-k8s.io"
)

// ErrPoolNotSynced: the informers did not sync before the context ended.
var ErrPoolNotSynced = errors.New("inference pool informers did not sync")

// PoolConfig names the InferencePool whose Ready pods are the allowlist.
type PoolConfig struct {
	// Namespace and Name of the InferencePool.
	Namespace, Name string
	// Group is GroupV1 (version v1) or GroupV1Alpha2 (version v1alpha2).
	Group string
}

// DefaultPoolNamespace is the namespace of a pool named without one.
const DefaultPoolNamespace = "default"

// ParsePool reads "namespace/name" or a bare "name" in namespace
// DefaultPoolNamespace (as --inference-pool gives it, read as llm-d does).
func ParsePool(ref, group string) (PoolConfig, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		ns, name = DefaultPoolNamespace, ref
	}
	if ns == "" || name == "" || strings.Contains(name, "/") {
		return PoolConfig{}, fmt.Errorf("--inference-pool %q is not namespace/name or name", ref)
	}
	c := PoolConfig{Namespace: ns, Name: name, Group: group}
	return c, c.Validate()
}

// Validate reports the first invalid setting, as one line.
func (c PoolConfig) Validate() error {
	switch {
	case c.Namespace == "" || c.Name == "":
		return errors.New("--inference-pool needs namespace/name")
	case c.Group != GroupV1 && c.Group != GroupV1Alpha2:
		return fmt.Errorf("--pool-group %q is not %s or %s", c.Group, GroupV1, GroupV1Alpha2)
	}
	return nil
}

// GVR is the pool resource for the configured group.
func (c PoolConfig) GVR() schema.GroupVersionResource {
	v := "v1"
	if c.Group == GroupV1Alpha2 {
		v = "v1alpha2"
	}
	return schema.GroupVersionResource{Group: c.Group, Version: v, Resource: "inferencepools"}
}

// PoolWatcher admits the host:port pairs of the InferencePool's Ready pods
// on the pool's target ports. It watches the pool and the pods of its
// namespace through the dynamic client with informers, rebuilds the set on
// every event and publishes it with an atomic pointer, so Allowed never
// locks. Until the first sync it admits nothing.
type PoolWatcher struct {
	cfg PoolConfig
	dyn dynamic.Interface
	log zerolog.Logger

	// set maps each admitted host:port to its pod's RoleLabel value.
	set atomic.Pointer[map[netip.AddrPort]string]

	mu      sync.Mutex // serialises rebuilds (informer goroutines)
	pool    cache.Store
	pods    cache.Store
	missing bool // the pool was not found at the last rebuild (logged once)
	obs     WatchObserver
	added   func([]Member) // see OnAdded; nil: nobody
}

// RoleLabel is the pod label by which llm-d tells prefill pods
// ("prefill") from decode pods ("decode", "both") in one pool.
const RoleLabel = "llm-d.ai/role"

// Member is one host:port the pool admits.
type Member struct {
	// Addr is "ip:port" (IPv6 in brackets).
	Addr string
	// Role is the pod's RoleLabel value ("" when it has none).
	Role string
}

// OnAdded makes fn hear of the admitted host:port pairs: at once of every
// one admitted now, then, after each rebuild, of those admitted that were
// not before (a new Ready pod, or one Ready again). fn runs on the
// watcher's goroutines, under its lock: it must not block or call the
// watcher.
func (w *PoolWatcher) OnAdded(fn func([]Member)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.added = fn
	if all := members(*w.set.Load(), nil); len(all) > 0 {
		fn(all)
	}
}

// members lists the entries of set not in prev (all of them when prev is
// nil).
func members(set, prev map[netip.AddrPort]string) []Member {
	var out []Member
	for ap, role := range set {
		if _, ok := prev[ap]; !ok {
			out = append(out, Member{Addr: ap.String(), Role: role})
		}
	}
	return out
}

// WatchObserver is told what a PoolWatcher sees: every event handled, by
// resource (inferencepools, pods), and the allowlist after each rebuild.
type WatchObserver interface {
	Event(resource string)
	Allowlist(allowed int, poolFound bool)
}

// Observe makes o the watcher's observer; call it before Run.
func (w *PoolWatcher) Observe(o WatchObserver) { w.obs = o }

// NewPoolWatcher returns a watcher of cfg's pool; Run starts it.
func NewPoolWatcher(cfg PoolConfig, dyn dynamic.Interface, log zerolog.Logger) (*PoolWatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &PoolWatcher{cfg: cfg, dyn: dyn, log: log.With().Str("inference_pool", cfg.Namespace+"/"+cfg.Name).Logger()}
	empty := map[netip.AddrPort]string{}
	w.set.Store(&empty)
	return w, nil
}

// Allowed implements Allowlist: hostport must be an IP literal and port of
// a Ready pod of the pool on one of its target ports.
func (w *PoolWatcher) Allowed(hostport string) bool {
	ap, ok := parseAddrPort(hostport)
	if !ok {
		return false
	}
	_, ok = (*w.set.Load())[ap]
	return ok
}

// Len is the number of admitted host:port pairs.
func (w *PoolWatcher) Len() int { return len(*w.set.Load()) }

// Run starts the informers, waits for their first sync (ready is closed
// then, when non-nil), and keeps the allowlist current until ctx ends; it
// returns after the informers stopped.
func (w *PoolWatcher) Run(ctx context.Context, ready chan<- struct{}) error {
	name := w.cfg.Name
	poolInf := informer(w.dyn, w.dyn.Resource(w.cfg.GVR()).Namespace(w.cfg.Namespace),
		func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + name })
	podInf := informer(w.dyn, w.dyn.Resource(PodsGVR).Namespace(w.cfg.Namespace), func(*metav1.ListOptions) {})
	w.pool, w.pods = poolInf.GetStore(), podInf.GetStore()
	for _, in := range []struct {
		inf      cache.SharedIndexInformer
		resource string
	}{{poolInf, w.cfg.GVR().Resource}, {podInf, PodsGVR.Resource}} {
		event := func() {
			if w.obs != nil {
				w.obs.Event(in.resource)
			}
			w.rebuild()
		}
		if _, err := in.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { event() },
			UpdateFunc: func(any, any) { event() },
			DeleteFunc: func(any) { event() },
		}); err != nil {
			return fmt.Errorf("%s informer: %w", in.resource, err)
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, inf := range []cache.SharedIndexInformer{poolInf, podInf} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inf.RunWithContext(ctx)
		}()
	}
	if !cache.WaitForCacheSync(ctx.Done(), poolInf.HasSynced, podInf.HasSynced) {
		return ErrPoolNotSynced
	}
	w.rebuild()
	w.log.Info().Int("allowed", w.Len()).Msg("inference pool allowlist synced")
	if ready != nil {
		close(ready)
	}
	<-ctx.Done()
	return nil
}

// informer lists and watches one namespaced resource as unstructured
// objects, with mod applied to every list and watch. Like client-go's
// dynamic informer it asks client whether it supports watch-list streams
// (fake clients do not).
func informer(client dynamic.Interface, ri dynamic.ResourceInterface, mod func(*metav1.ListOptions)) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			mod(&o)
			return ri.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			mod(&o)
			return ri.Watch(ctx, o)
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&unstructured.Unstructured{}, 0, cache.Indexers{})
}

// rebuild recomputes the allowed set from the informers' caches.
func (w *PoolWatcher) rebuild() {
	w.mu.Lock()
	defer w.mu.Unlock()
	next := map[netip.AddrPort]string{}
	obj, exists, err := w.pool.GetByKey(w.cfg.Namespace + "/" + w.cfg.Name)
	if missing := err != nil || !exists; missing != w.missing {
		w.missing = missing
		if missing {
			w.log.Warn().Msg("inference pool not found: allowing no prefiller until it exists (fail closed)")
		} else {
			w.log.Info().Msg("inference pool found")
		}
	}
	if err == nil && exists {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			sel, ports, perr := poolSpec(u)
			if perr != nil {
				w.log.Error().Err(perr).Msg("inference pool spec unusable; allowing no prefiller")
			} else {
				w.addPods(next, sel, ports)
			}
		}
	}
	old := *w.set.Load()
	prev := len(old)
	w.set.Store(&next)
	if w.obs != nil {
		w.obs.Allowlist(len(next), !w.missing)
	}
	if w.added != nil {
		if add := members(next, old); len(add) > 0 {
			w.added(add)
		}
	}
	if prev != len(next) {
		w.log.Info().Int("allowed", len(next)).Msg("inference pool allowlist changed")
	}
}

func (w *PoolWatcher) addPods(set map[netip.AddrPort]string, sel labels.Selector, ports []uint16) {
	for _, o := range w.pods.List() {
		pod, ok := o.(*unstructured.Unstructured)
		if !ok || !sel.Matches(labels.Set(pod.GetLabels())) || !podReady(pod) {
			continue
		}
		for _, ip := range podIPs(pod) {
			for _, p := range ports {
				set[netip.AddrPortFrom(ip, p)] = pod.GetLabels()[RoleLabel]
			}
		}
	}
}

// poolSpec reads the pod selector and target ports of a v1 pool
// (spec.selector.matchLabels, spec.targetPorts[].number) or a v1alpha2 pool
// (spec.selector as a label map, spec.targetPortNumber).
func poolSpec(u *unstructured.Unstructured) (labels.Selector, []uint16, error) {
	m, found, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil || !found {
		m, found, err = unstructured.NestedStringMap(u.Object, "spec", "selector")
	}
	if err != nil || !found || len(m) == 0 {
		return nil, nil, errors.New("spec.selector has no labels")
	}
	var ports []uint16
	if list, ok, _ := unstructured.NestedSlice(u.Object, "spec", "targetPorts"); ok {
		for _, e := range list {
			if pm, ok := e.(map[string]any); ok {
				if n, ok, _ := unstructured.NestedInt64(pm, "number"); ok && n > 0 && n < 65536 {
					ports = append(ports, uint16(n))
				}
			}
		}
	}
	if n, ok, _ := unstructured.NestedInt64(u.Object, "spec", "targetPortNumber"); ok && n > 0 && n < 65536 {
		ports = append(ports, uint16(n))
	}
	if len(ports) == 0 {
		return nil, nil, errors.New("spec has no target port")
	}
	return labels.SelectorFromSet(m), ports, nil
}

// podReady reports a running pod, not being deleted, whose Ready condition
// is True.
func podReady(p *unstructured.Unstructured) bool {
	if p.GetDeletionTimestamp() != nil {
		return false
	}
	if phase, _, _ := unstructured.NestedString(p.Object, "status", "phase"); phase != "Running" {
		return false
	}
	conds, _, _ := unstructured.NestedSlice(p.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if ok && m["type"] == "Ready" {
			return m["status"] == "True"
		}
	}
	return false
}

// podIPs returns status.podIP and status.podIPs[].ip, unique.
func podIPs(p *unstructured.Unstructured) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if ip, err := netip.ParseAddr(s); err == nil {
			ip = ip.Unmap()
			for _, have := range out {
				if have == ip {
					return
				}
			}
			out = append(out, ip)
		}
	}
	if ip, _, _ := unstructured.NestedString(p.Object, "status", "podIP"); ip != "" {
		add(ip)
	}
	list, _, _ := unstructured.NestedSlice(p.Object, "status", "podIPs")
	for _, e := range list {
		if m, ok := e.(map[string]any); ok {
			if ip, ok := m["ip"].(string); ok {
				add(ip)
			}
		}
	}
	return out
}
