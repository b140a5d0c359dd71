//go:build k8s

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// TestK8sWatchCost measures what the sidecars' watches cost the real API
// server: with N sidecars watching one pool (each a watch of the pool and
// one of its namespace's pods), the server's open watches and resident
// memory, etcd's, each sidecar's, and the pod events each sidecar handles
// for a churn of pod status updates (pd_sidecar_inference_pool_events_total).
// N is 1 and 3 by default (make test-k8s); K8S_WATCH_SIDECARS=1,10,50
// (make k8s-watch-cost) measures the table of docs/deploy.md.
func TestK8sWatchCost(t *testing.T) {
	ns := []int{1, 3}
	if v := os.Getenv("K8S_WATCH_SIDECARS"); v != "" {
		ns = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			require.NoError(t, err, "K8S_WATCH_SIDECARS")
			ns = append(ns, n)
		}
	}
	const pods, churn = 20, 40
	var rows []string
	for _, n := range ns {
		b := newK8sCluster(t)
		for i := range pods {
			b.createPod(t, "prefill-"+itoa(i), map[string]string{"app": "prefill"})
			b.setReady(t, "prefill-"+itoa(i), "127.0.0."+itoa(10+i), true)
		}
		b.createPod(t, "unrelated", map[string]string{"app": "frontend"})
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
		before := podEvents()
		start := time.Now()
		for i := range churn { // every update changes the pod: Ready false, then true again
			b.setReady(t, "prefill-"+itoa(i%pods), "127.0.0."+itoa(10+i%pods), (i/pods)%2 == 1)
		}
		b.setReady(t, "unrelated", "127.0.0.99", true) // a pod outside the pool
		var events float64
		harness.Eventually(t, 60*time.Second, "every update seen by every sidecar", func() bool {
			events = podEvents() - before
			return events >= float64((churn+1)*n)
		})
		took := time.Since(start)
		var scRSS int64
		for _, sc := range scs {
			scRSS += rssKB(t, sc.Pid())
		}
		rows = append(rows, fmt.Sprintf("| %d | %.0f | %.2f | %d → %d MB | %d MB | %.0f MB | %v |", n, watches, events/float64(churn+1)/float64(n),
			idleServer/1024, rssKB(t, b.c.ServerPID())/1024, rssKB(t, b.c.EtcdPID())/1024, float64(scRSS)/float64(n)/1024,
			took.Round(time.Millisecond)))
		require.GreaterOrEqual(t, watches, float64(2*n), "a pool watch and a pod watch per sidecar")
		require.Equal(t, float64((churn+1)*n), events,
			"each sidecar handles every pod update of the namespace once, the pod outside the pool's too")
		b.c.Stop()
	}
	t.Logf("\n%d status updates of %d pool pods and 1 other pod:\n| sidecars | open watches (added) | pod events handled per sidecar per update | kube-apiserver RSS (idle → with the sidecars) | etcd RSS | RSS per sidecar | every update seen by every sidecar in |\n|---|---|---|---|---|---|---|\n%s",
		churn, pods, strings.Join(rows, "\n"))
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
