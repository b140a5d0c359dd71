package ssrf

import (
	"context"
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// heard collects what OnAdded reports.
type heard struct {
	mu  sync.Mutex
	all []Member
}

func (h *heard) add(m []Member) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.all = append(h.all, m...)
}

func (h *heard) addrs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, m := range h.all {
		out = append(out, m.Addr+" "+m.Role)
	}
	sort.Strings(out)
	return out
}

// TestPoolWatcherReportsAdded: OnAdded hears of every member at once, then
// of each one admitted anew (a new Ready pod, one Ready again), with its
// role label; never of one removed.
func TestPoolWatcherReportsAdded(t *testing.T) {
	noLeaks(t)
	pre := map[string]string{"app": "prefill", RoleLabel: "prefill"}
	r := startWatcher(t, GroupV1, poolV1(8000),
		pod("p0", "10.0.0.1", true, pre),
		pod("d0", "10.0.0.2", true, map[string]string{"app": "prefill", RoleLabel: "decode"}),
		pod("p1", "10.0.0.3", false, pre),
	)
	var h heard
	r.w.OnAdded(h.add)
	assert.Equal(t, []string{"10.0.0.1:8000 prefill", "10.0.0.2:8000 decode"}, h.addrs())

	ctx := context.Background()
	pods := r.dyn.Resource(PodsGVR).Namespace("ns")
	_, err := pods.UpdateStatus(ctx, pod("p1", "10.0.0.3", true, pre), metav1.UpdateOptions{})
	assert.NoError(t, err)
	eventually(t, "p1 reported once Ready", func() bool { return len(h.addrs()) == 3 })
	assert.Contains(t, h.addrs(), "10.0.0.3:8000 prefill")

	_, err = pods.UpdateStatus(ctx, pod("p0", "10.0.0.1", false, pre), metav1.UpdateOptions{})
	assert.NoError(t, err)
	eventually(t, "p0 denied", func() bool { return !r.w.Allowed("10.0.0.1:8000") })
	assert.Len(t, h.addrs(), 3, "a removal is not reported")
	_, err = pods.UpdateStatus(ctx, pod("p0", "10.0.0.1", true, pre), metav1.UpdateOptions{})
	assert.NoError(t, err)
	eventually(t, "p0 reported again once Ready again", func() bool { return len(h.addrs()) == 4 })
}
