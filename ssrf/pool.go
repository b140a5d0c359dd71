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
// on the pool's target ports. It watches the pool, and the pods its
// selector selects — selected by the API server, so that a sidecar hears of
// no other pod of the namespace — through the dynamic client with
// informers, each pod reduced to what the allowlist reads (slimPod). It
// rebuilds the set on every event and publishes it with an atomic pointer,
// so Allowed never locks. Until the first sync it admits nothing.
//
// When the pool's selector changes, a watch of the new selector is
// started; the allowlist stays the old selector's, kept current by the
// old watch, until the new one has synced, and then becomes the new
// selector's at once: there is no moment where it is empty for the change,
// nor one where it mixes the two.
type PoolWatcher struct {
	cfg PoolConfig
	dyn dynamic.Interface
	log zerolog.Logger

	// set maps each admitted host:port to its pod's RoleLabel value.
	set atomic.Pointer[map[netip.AddrPort]string]

	mu      sync.Mutex // serialises rebuilds (informer goroutines)
	pool    cache.Store
	missing bool // the pool was not found at the last rebuild (logged once)
	obs     WatchObserver
	added   func([]Member) // see OnAdded; nil: nobody

	// active is the pod watch the allowlist is built from (nil: none yet);
	// pending the watch of the pool's new selector while it syncs. Both
	// run under runCtx; watches counts their goroutines.
	active, pending *podWatch
	runCtx          context.Context
	watches         sync.WaitGroup
	// firstSync is closed once the first pod watch has synced.
	firstSync chan struct{}
}

// podWatch is the watch of the pods one selector selects.
type podWatch struct {
	selector string // as the API server is sent it
	sel      labels.Selector
	ports    []uint16 // the pool's target ports, the last seen with this selector
	store    cache.Store
	stop     context.CancelFunc
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
	w := &PoolWatcher{cfg: cfg, dyn: dyn, log: log.With().Str("inference_pool", cfg.Namespace+"/"+cfg.Name).Logger(),
		firstSync: make(chan struct{})}
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

// Run starts the pool's informer and, once the pool names a selector, the
// pods' (a new one for each new selector), waits for their first sync
// (ready is closed then, when non-nil; with no usable pool at that time,
// once the pool's informer synced), and keeps the allowlist current until
// ctx ends; it returns after every informer stopped.
func (w *PoolWatcher) Run(ctx context.Context, ready chan<- struct{}) error {
	defer w.watches.Wait()
	name := w.cfg.Name
	poolInf := informer(w.dyn, w.dyn.Resource(w.cfg.GVR()).Namespace(w.cfg.Namespace),
		func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + name })
	w.mu.Lock()
	w.pool, w.runCtx = poolInf.GetStore(), ctx
	w.mu.Unlock()
	if _, err := poolInf.AddEventHandler(w.handler(w.cfg.GVR().Resource)); err != nil {
		return fmt.Errorf("%s informer: %w", w.cfg.GVR().Resource, err)
	}
	w.watches.Go(func() { poolInf.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), poolInf.HasSynced) {
		return ErrPoolNotSynced
	}
	w.rebuild()
	w.mu.Lock()
	waiting := w.pending != nil
	w.mu.Unlock()
	if waiting {
		select {
		case <-w.firstSync:
		case <-ctx.Done():
			return ErrPoolNotSynced
		}
	}
	w.log.Info().Int("allowed", w.Len()).Msg("inference pool allowlist synced")
	if ready != nil {
		close(ready)
	}
	<-ctx.Done()
	return nil
}

// handler counts an informer's events for resource and rebuilds on each.
func (w *PoolWatcher) handler(resource string) cache.ResourceEventHandlerFuncs {
	event := func() {
		if w.obs != nil {
			w.obs.Event(resource)
		}
		w.rebuild()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { event() },
		UpdateFunc: func(any, any) { event() },
		DeleteFunc: func(any) { event() },
	}
}

// watchPods starts the watch of the pods sel selects (w.mu held): it
// becomes pending, and active once it has synced if it is still pending
// then.
func (w *PoolWatcher) watchPods(sel labels.Selector, ports []uint16) {
	ctx, stop := context.WithCancel(w.runCtx)
	selector := sel.String()
	inf := informer(w.dyn, w.dyn.Resource(PodsGVR).Namespace(w.cfg.Namespace),
		func(o *metav1.ListOptions) { o.LabelSelector = selector })
	pw := &podWatch{selector: selector, sel: sel, ports: ports, store: inf.GetStore(), stop: stop}
	if err := inf.SetTransform(slimPod); err != nil {
		w.log.Error().Err(err).Msg("pod informer transform") // only once the informer runs
	}
	if _, err := inf.AddEventHandler(w.handler(PodsGVR.Resource)); err != nil {
		w.log.Error().Err(err).Msg("pod informer handler")
	}
	w.pending = pw
	w.watches.Go(func() { inf.RunWithContext(ctx) })
	w.watches.Go(func() {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return
		}
		w.mu.Lock()
		if w.pending != pw {
			w.mu.Unlock()
			return // given up for another selector meanwhile
		}
		old := w.active
		w.active, w.pending = pw, nil
		first := old == nil
		w.mu.Unlock()
		if old != nil {
			old.stop()
		}
		w.log.Info().Str("selector", selector).Msg("inference pool pods watched by the pool's selector")
		w.rebuild()
		if first {
			close(w.firstSync)
		}
	})
}

// informer lists and watches one namespaced resource as unstructured
// objects, with mod applied to every list and watch. Like client-go's
// dynamic informer it asks client whether it supports watch-list streams
// (fake clients do not): where the API server does, the initial list is a
// watch that streams the objects from its cache, not one list response
// built whole in its memory per sidecar (client-go's WatchListClient, on by
// default; KUBE_FEATURE_WatchListClient=false turns it off).
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
				w.follow(sel, ports)
				if a := w.active; a != nil {
					addPods(next, a.store, a.sel, a.ports)
				}
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

// follow makes the pod watches follow the pool's selector and ports (w.mu
// held): the active watch's selector takes the new ports at once; another
// selector gets a watch of its own, which replaces the active one once it
// has synced (the allowlist is the active selector's until then).
func (w *PoolWatcher) follow(sel labels.Selector, ports []uint16) {
	selector := sel.String()
	if a := w.active; a != nil && a.selector == selector {
		a.ports = ports
		if p := w.pending; p != nil {
			p.stop() // the pool is back on the active selector
			w.pending = nil
		}
		return
	}
	if p := w.pending; p != nil {
		if p.selector == selector {
			p.ports = ports
			return
		}
		p.stop()
	}
	if w.runCtx != nil {
		w.watchPods(sel, ports)
	}
}

func addPods(set map[netip.AddrPort]string, pods cache.Store, sel labels.Selector, ports []uint16) {
	for _, o := range pods.List() {
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

// slimPod reduces a pod, before the informer caches it, to what the
// allowlist reads: its name, namespace, uid, resource version, labels and
// deletion timestamp, its phase, IPs and Ready condition. The rest — spec,
// managedFields, annotations, container statuses — is most of a pod's
// bytes, and a sidecar in every decode pod would keep it for every pool
// pod. Anything but a pod object (a deletion's last known state) passes
// as it is.
func slimPod(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	meta := map[string]any{}
	for _, k := range []string{"name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp"} {
		if v, ok := u.Object["metadata"].(map[string]any)[k]; ok {
			meta[k] = v
		}
	}
	status := map[string]any{}
	if st, ok := u.Object["status"].(map[string]any); ok {
		for _, k := range []string{"phase", "podIP", "podIPs"} {
			if v, ok := st[k]; ok {
				status[k] = v
			}
		}
		if conds, ok := st["conditions"].([]any); ok {
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Ready" {
					status["conditions"] = []any{map[string]any{"type": "Ready", "status": m["status"]}}
				}
			}
		}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": u.GetAPIVersion(), "kind": u.GetKind(), "metadata": meta, "status": status,
	}}, nil
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
