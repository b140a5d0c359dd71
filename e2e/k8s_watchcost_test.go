//go:build k8s

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestK8sWatchCost measures what the sidecars' watches cost the real API
// server and themselves: N sidecars watch one pool of 20 pods in a
// namespace that also holds other pods (200 by default, K8S_OTHER_PODS).
// Every other pod's status is updated once, then the pool's pods 40 times.
// Each sidecar handles every pool pod update once and no other pod's
// update at all (pd_sidecar_inference_pool_events_total: the watch is
// selected by the pool's selector on the server), and its RSS does not
// follow the other pods. The table: open watches, events, the server's,
// etcd's and each sidecar's resident memory, and how long until every
// sidecar saw every update. N is 1 and 3 by default (make test-k8s);
// make k8s-watch-cost measures docs/deploy.md's table (1, 10 and 50
// sidecars, 1,000 other pods).
func TestK8sWatchCost(t *testing.T) {
	ns := envInts(t, "K8S_WATCH_SIDECARS", []int{1, 3})
	others := envInts(t, "K8S_OTHER_PODS", []int{200})[0]
	const pods, churn = 20, 40
	var rows []string
	for _, n := range ns {
		b := newK8sCluster(t)
		for i := range pods {
			b.createPod(t, "prefill-"+itoa(i), map[string]string{"app": "prefill"})
			b.setReady(t, "prefill-"+itoa(i), "127.0.0."+itoa(10+i), true)
		}
		b.createPods(t, "other-", others, map[string]string{"app": "frontend"})
		idleServer := rssKB(t, b.c.ServerPID())
		watchesBefore := serverMetric(t, b, "apiserver_longrunning_requests", map[string]string{"verb": "WATCH"})
		var scs []*harness.Sidecar
		for range n {
			scs = append(scs, b.startSidecar(t, b.c.Kubeconfig))
		}
		harness.Eventually(t, 60*time.Second, "every sidecar's two watches open", func() bool {
			return serverMetric(t, b, "apiserver_longrunning_requests", map[string]string{"verb": "WATCH"})-watchesBefore >= float64(2*n)
		})
		watches := serverMetric(t, b, "apiserver_longrunning_requests", map[string]string{"verb": "WATCH"}) - watchesBefore
		podEvents := func() float64 {
			var sum float64
			for _, sc := range scs {
				sum += sc.Metric(t, "pd_sidecar_inference_pool_events_total", map[string]string{"resource": "pods"})
			}
			return sum
		}
		sidecarsRSS := func() int64 {
			var sum int64
			for _, sc := range scs {
				sum += rssKB(t, sc.Pid())
			}
			return sum
		}
		before, rssBefore := podEvents(), sidecarsRSS()
		// The other pods first: a watch delivers its events in order, so
		// once the pool's last update is seen, any event of theirs would
		// have been seen before it.
		b.setReadyAll(t, "other-", others, "127.0.1.1")
		start := time.Now()
		for i := range churn { // every update changes the pod: Ready false, then true again
			b.setReady(t, "prefill-"+itoa(i%pods), "127.0.0."+itoa(10+i%pods), (i/pods)%2 == 1)
		}
		var events float64
		harness.Eventually(t, 60*time.Second, "every pool update seen by every sidecar", func() bool {
			events = podEvents() - before
			return events >= float64(churn*n)
		})
		took := time.Since(start)
		rssAfter := sidecarsRSS()
		rows = append(rows, fmt.Sprintf("| %d | %d | %.0f | %.2f | %.0f | %d → %d MB | %d MB | %.1f MB | %+.1f MB | %v |", n, others, watches,
			events/float64(churn)/float64(n), events-float64(churn*n),
			idleServer/1024, rssKB(t, b.c.ServerPID())/1024, rssKB(t, b.c.EtcdPID())/1024, float64(rssAfter)/float64(n)/1024,
			float64(rssAfter-rssBefore)/float64(n)/1024, took.Round(time.Millisecond)))
		require.GreaterOrEqual(t, watches, float64(2*n), "a pool watch and a pod watch per sidecar")
		require.Equal(t, float64(churn*n), events,
			"each sidecar handles every pool pod update once, and none of the other pods' %d updates", others)
		b.c.Stop()
	}
	t.Logf("\n%d status updates of %d pool pods, after one of each of the other pods:\n| sidecars | other pods | open watches (added) | pool pod events handled per sidecar per update | events of the other pods' updates | kube-apiserver RSS (idle → with the sidecars) | etcd RSS | RSS per sidecar | RSS per sidecar over the other pods' updates | every pool update seen by every sidecar in |\n|---|---|---|---|---|---|---|---|---|---|\n%s",
		churn, pods, strings.Join(rows, "\n"))
}

// envInts reads a comma-separated list of integers from env (def when
// unset).
func envInts(t *testing.T, env string, def []int) []int {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(t, err, env)
		out = append(out, n)
	}
	return out
}

// createPods creates n pods named prefix0.. with labels, 8 at a time.
func (b *k8sBed) createPods(t *testing.T, prefix string, n int, labels map[string]string) {
	t.Helper()
	b.eachPod(t, prefix, n, func(name string) error {
		_, err := b.c.Client.CoreV1().Pods(b.ns).Create(context.Background(), &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx"}}},
		}, metav1.CreateOptions{})
		return err
	})
}

// setReadyAll sets the status of pods prefix0.. to Running and Ready on ip,
// 8 at a time.
func (b *k8sBed) setReadyAll(t *testing.T, prefix string, n int, ip string) {
	t.Helper()
	b.eachPod(t, prefix, n, func(name string) error {
		pods := b.c.Client.CoreV1().Pods(b.ns)
		p, err := pods.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}}
		_, err = pods.UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		return err
	})
}

// eachPod runs f on pods prefix0..prefix(n-1), 8 at a time, and fails t
// on the first error.
func (b *k8sBed) eachPod(t *testing.T, prefix string, n int, f func(name string) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	slots := make(chan struct{}, 8)
	for i := range n {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			errs <- f(prefix + itoa(i))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// serverMetric sums the API server's samples of name whose labels include
// want.
func serverMetric(t *testing.T, b *k8sBed, name string, want map[string]string) float64 {
	t.Helper()
	raw, err := b.c.Get(context.Background(), "/metrics")
	require.NoError(t, err)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	require.NoError(t, err)
	return harness.Metrics(fams).Value(name, want)
}

// rssKB is pid's resident set in KiB.
func rssKB(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			v, err := strconv.ParseInt(f[1], 10, 64)
			require.NoError(t, err)
			return v
		}
	}
	t.Fatalf("no VmRSS for %d", pid)
	return 0
}
