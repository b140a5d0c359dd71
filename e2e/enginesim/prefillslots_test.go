package enginesim

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPrefillSlots: with --prefill-slots N, k concurrent prefills compute
// in ceil(k/N) waves, the ones without a slot counted as waiting meanwhile;
// 0 leaves them all computing at once. Local requests and prefill legs take
// the same slots.
func TestPrefillSlots(t *testing.T) {
	const (
		tokens = 60
		// 1.2 s a prefill: a wave more or less is a second, far more than
		// a loaded machine adds to a few requests.
		perToken = 20 * time.Millisecond
		prefill  = tokens * perToken
	)
	cases := []struct {
		name        string
		slots       int
		k           int
		prefillLegs int // of the k, how many are prefill legs for a remote decoder
		waves       int
		maxWaiting  float64
	}{
		{"unbounded", 0, 4, 0, 1, 0},
		{"one slot", 1, 4, 0, 4, 3},
		{"two slots", 2, 4, 0, 2, 2},
		{"one slot, local and prefill legs", 1, 3, 2, 3, 2},
		{"more slots than prefills", 8, 3, 0, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startSim(t, RoleBoth, func(c *Config) {
				c.PrefillSlots = tc.slots
				c.PrefillPerToken = perToken
			})
			var maxWaiting atomic.Int64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
					if w := int64(s.metric(t, "vllm:num_requests_waiting")); w > maxWaiting.Load() {
						maxWaiting.Store(w)
					}
				}
			}()
			var wg sync.WaitGroup
			start := time.Now()
			for i := range tc.k {
				// A distinct first token: no prefix cache hit between them.
				prompt := fmt.Sprintf("x%d %s", i, longPrompt(tokens-1))
				body := fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":1}`, prompt)
				if i < tc.prefillLegs {
					body = fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":1,%s}`, prompt, prefillKV)
				}
				wg.Go(func() {
					a := post(t, s.url+"/v1/completions", body)
					assert.Equal(t, 200, a.status, "%s", a.body)
				})
			}
			wg.Wait()
			took := time.Since(start)
			close(stop)
			<-sampled
			want := time.Duration(tc.waves) * prefill
			assert.GreaterOrEqual(t, took, want-prefill/10, "%d prefills in %d waves", tc.k, tc.waves)
			assert.Less(t, took, want+prefill*8/10, "%d prefills in %d waves", tc.k, tc.waves)
			assert.Equal(t, tc.maxWaiting, float64(maxWaiting.Load()), "peak of vllm:num_requests_waiting")
			assert.Equal(t, 0.0, s.metric(t, "vllm:num_requests_waiting"), "none left waiting")
			assert.Equal(t, 0.0, s.metric(t, "vllm:num_requests_running"), "none left running")
			assert.Equal(t, float64(tc.k), s.metric(t, "sim_prefills_computed_total"))
		})
	}
}

// TestPrefillSlotsCancelledWhileWaiting: a request whose client leaves while
// it waits for a prefill slot stops waiting and takes no slot.
func TestPrefillSlotsCancelledWhileWaiting(t *testing.T) {
	s := startSim(t, RoleBoth, func(c *Config) {
		c.PrefillSlots = 1
		c.PrefillPerToken = 500 * time.Millisecond
	})
	// 30 s of prefill: the second request comes and leaves while the first
	// holds the slot, on any machine; the first's client leaves then too.
	post := func(ctx context.Context, prompt string, done chan<- error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":1}`, prompt+" "+longPrompt(59))))
		if err == nil {
			var resp *http.Response
			if resp, err = http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}
		done <- err
	}
	firstCtx, cancelFirst := context.WithCancel(context.Background())
	defer cancelFirst()
	first := make(chan error, 1)
	go post(firstCtx, "a", first)
	// The first one holds the slot once it computes (running alone is
	// counted before the slot is taken).
	require.Eventually(t, func() bool { return s.metric(t, "sim_prefills_computed_total") == 1 }, 30*time.Second, 2*time.Millisecond)
	// The second one waits behind it, and its client leaves once the engine
	// counts it waiting.
	secondCtx, cancelSecond := context.WithCancel(context.Background())
	defer cancelSecond()
	second := make(chan error, 1)
	go post(secondCtx, "b", second)
	require.Eventually(t, func() bool { return s.metric(t, "vllm:num_requests_waiting") == 1 }, 30*time.Second, 2*time.Millisecond)
	cancelSecond()
	require.Error(t, <-second)
	require.Eventually(t, func() bool {
		return s.metric(t, "vllm:num_requests_waiting") == 0 && s.kindMetric(t, "sim_requests_cancelled_total", "local") == 1
	}, 30*time.Second, 2*time.Millisecond)
	assert.Equal(t, 1.0, s.metric(t, "vllm:num_requests_running"), "the first one still computes")
	cancelFirst()
	require.Error(t, <-first)
	require.Eventually(t, func() bool { return s.metric(t, "vllm:num_requests_running") == 0 }, 30*time.Second, 5*time.Millisecond)
	assert.Equal(t, 2.0, s.kindMetric(t, "sim_requests_cancelled_total", "local"))
	assert.Equal(t, 1.0, s.metric(t, "sim_prefills_computed_total"), "the cancelled one never computed")
}

func TestPrefillSlotsValidated(t *testing.T) {
	c := DefaultConfig()
	c.PrefillSlots = -1
	require.ErrorIs(t, c.Validate(), ErrInvalidConfig)
}
