//go:build k8s

package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// startSidecars starts n sidecars with args at once — each process
// started without waiting for the others — and waits for each to answer
// /health. env is added to their environment (NAME=value).
func startSidecars(t *testing.T, modelServerPort, n int, env []string, args ...string) []*harness.Sidecar {
	t.Helper()
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		t.Setenv(name, value)
	}
	bin := harness.Binary(t, "pd-sidecar")
	scs := make([]*harness.Sidecar, n)
	for i := range scs {
		s := &harness.Sidecar{Port: harness.FreePorts(t, 4)}
		s.Proc = harness.Start(t, bin, append([]string{"--port", itoa(s.Port), "--model-server-port", itoa(modelServerPort),
			"--prefill-timeout", "5s", "--connect-timeout", "1s", "--log-level", "info"}, args...)...)
		scs[i] = s
	}
	for _, s := range scs {
		s.WaitHTTP(t, s.URL()+"/health", 60*time.Second)
	}
	return scs
}

// peakSampler samples a process's RSS every 20 ms until stopped, and keeps
// the largest.
type peakSampler struct {
	stop chan struct{}
	done chan struct{}
	peak int64
}

func samplePeak(t *testing.T, pid int) *peakSampler {
	s := &peakSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					var kb int64
					if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil && kb > s.peak {
						s.peak = kb
					}
				}
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *peakSampler) end() int64 {
	close(s.stop)
	<-s.done
	return s.peak
}

// TestK8sFleetStartup: N sidecars start at once (a rolling restart, a node
// pool replaced) over a pool of 20 Ready pods in a namespace that also
// holds other pods, with client-go's streaming initial list (watch-list,
// its default) and with a list per sidecar
// (KUBE_FEATURE_WatchListClient=false). Every sidecar syncs and admits
// exactly the pool's 20 pods either way; the table has the API server's
// peak RSS over the start and the time until every sidecar had synced. N
// is 3 by default (make test-k8s); K8S_FLEET_SIDECARS=50 (make
// k8s-watch-cost) measures docs/deploy.md's table.
func TestK8sFleetStartup(t *testing.T) {
	n := envInts(t, "K8S_FLEET_SIDECARS", []int{3})[0]
	others := envInts(t, "K8S_OTHER_PODS", []int{200})[0]
	const pods = 20
	var rows []string
	for _, mode := range []struct {
		name string
		env  []string
	}{{"watch-list (streaming initial list)", []string{"KUBE_FEATURE_WatchListClient=true"}},
		{"list", []string{"KUBE_FEATURE_WatchListClient=false"}}} {
		t.Run(strings.Fields(mode.name)[0], func(t *testing.T) {
			b := newK8sCluster(t)
			b.createPods(t, "prefill-", pods, map[string]string{"app": "prefill"})
			for i := range pods {
				b.setReady(t, "prefill-"+itoa(i), "127.0.0."+itoa(10+i), true)
			}
			b.createPods(t, "other-", others, map[string]string{"app": "frontend"})
			b.setReadyAll(t, "other-", others, "127.0.1.1")
			idle := rssKB(t, b.c.ServerPID())
			peak := samplePeak(t, b.c.ServerPID())
			start := time.Now()
			scs := startSidecars(t, b.decode.Port, n, mode.env, b.sidecarArgs(b.c.Kubeconfig)...)
			harness.Eventually(t, 120*time.Second, "every sidecar synced", func() bool {
				for _, sc := range scs {
					if sc.Metric(t, "pd_sidecar_inference_pool_allowed", nil) != pods {
						return false
					}
				}
				return true
			})
			took := time.Since(start)
			top := peak.end()
			for _, sc := range scs {
				require.Contains(t, sc.Output(), "inference pool pods watched by the pool's selector")
			}
			rows = append(rows, fmt.Sprintf("| %s | %d | %d | %d → peak %d MB | %v |", mode.name, n, others, idle/1024, top/1024, took.Round(time.Millisecond)))
			b.c.Stop()
		})
	}
	t.Logf("\n%d sidecars started at once over a pool of %d Ready pods:\n| initial sync | sidecars | other pods in the namespace | kube-apiserver RSS (idle → peak over the start) | until every sidecar synced |\n|---|---|---|---|---|\n%s",
		n, pods, strings.Join(rows, "\n"))
}

// TestK8sPrewarmSpread: N sidecars with --prefill-prewarm watch a pool
// whose prefill pod (a real engine-sim on 127.0.0.2) becomes Ready: each
// warms it once, and the prefiller sees N warm-up prefills, within about
// 100 ms without --prefill-prewarm-spread and spread over the window with
// it. The table has the most warm-ups the prefiller took in any second and
// the time from Ready to the last one. N is 3 by default (make test-k8s);
// K8S_PREWARM_SIDECARS=50 (make k8s-watch-cost) measures docs/deploy.md's
// table.
func TestK8sPrewarmSpread(t *testing.T) {
	n := envInts(t, "K8S_PREWARM_SIDECARS", []int{3})[0]
	var rows []string
	for _, spread := range []time.Duration{0, 5 * time.Second} {
		t.Run(spread.String(), func(t *testing.T) {
			b := newK8sCluster(t)
			b.createPod(t, "prefill-0", map[string]string{"app": "prefill"})
			scs := startSidecars(t, b.decode.Port, n, nil,
				append(b.sidecarArgs(b.c.Kubeconfig), "--prefill-prewarm", "--prefill-prewarm-spread", spread.String())...)
			prefills := func() float64 { return b.prefill.Metric(t, "sim_remote_decode_prefills_total", nil) }
			require.Zero(t, prefills())
			var mu sync.Mutex
			var seen []time.Duration // when each warm-up prefill was counted, since Ready
			ready := time.Now()
			b.setReady(t, "prefill-0", "127.0.0.2", true)
			last := 0.0
			harness.Eventually(t, spread+60*time.Second, "every sidecar warmed the new prefiller", func() bool {
				now := prefills()
				mu.Lock()
				for ; last < now; last++ {
					seen = append(seen, time.Since(ready))
				}
				mu.Unlock()
				return now >= float64(n)
			})
			oks := 0.0
			for _, sc := range scs {
				oks += sc.Metric(t, "pd_sidecar_prewarms_total", map[string]string{"result": "ok"})
			}
			require.Equal(t, float64(n), oks, "one warm-up per sidecar, each answered")
			require.Equal(t, float64(n), prefills(), "the prefiller took exactly one warm-up per sidecar")
			slices.Sort(seen)
			most := 0
			for i := range seen {
				j := i
				for j < len(seen) && seen[j]-seen[i] < time.Second {
					j++
				}
				most = max(most, j-i)
			}
			rows = append(rows, fmt.Sprintf("| %v | %d | %d | %v |", spread, n, most, seen[len(seen)-1].Round(10*time.Millisecond)))
			b.c.Stop()
		})
	}
	t.Logf("\n%d sidecars, one prefill pod becoming Ready (warm-ups counted by the prefiller every 20 ms):\n| --prefill-prewarm-spread | sidecars | most warm-ups in one second | Ready → last warm-up |\n|---|---|---|---|\n%s",
		n, strings.Join(rows, "\n"))
}
