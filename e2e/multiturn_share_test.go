package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMultiturnStoreShareSurvivesAFlood: one client (its connections from
// 127.0.0.2) sends 2,000 split turns, each under a session key of its
// own, into a store of 64 conversations; another client's conversation
// (from 127.0.0.1), kept before the flood, still finds its history on its
// next turn: the turn uses it (pd_sidecar_multiturn_uses_total moves, the
// prefiller pulls the history's blocks) and is token-exact against a
// local run. The flood made room from its own oldest conversations,
// counted client_share. On the lane and on fasthttp's path (each serving
// both clients), which tell the feature each request's TCP peer.
func TestMultiturnStoreShareSurvivesAFlood(t *testing.T) {
	const flood, size = 2000, 64
	drivers(t, func(t *testing.T, whole bool) {
		flags := []string{"--bidirectional-cache-size", itoa(size)}
		if !whole {
			flags = append(flags, "--stream-loops=0") // the flood's requests too
		}
		r := newMTRig(t, whole, nil, nil, flags...)
		first := []map[string]any{user(70, 120)}
		a := r.chatTurn(t, first, "victim", false, false)
		require.Equal(t, 1.0, r.sc.Metric(t, "pd_sidecar_multiturn_entries_total", map[string]string{"outcome": "kept"}))

		// The flood, from another address, eight at a time.
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			MaxIdleConnsPerHost: 8,
			DialContext:         (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext,
		}}
		t.Cleanup(client.CloseIdleConnections)
		var next, failed atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for i := next.Add(1); i <= flood; i = next.Add(1) {
					body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": []map[string]any{user(uint64(1000+i), 12)}, "max_tokens": 1})
					req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, r.sc.URL()+"/v1/chat/completions", strings.NewReader(string(body)))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("x-prefiller-host-port", r.prefill.HostPort())
					req.Header.Set("x-session-token", fmt.Sprint("flood-", i))
					resp, err := client.Do(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		require.Zero(t, failed.Load(), "every flood request answered 200")
		if whole {
			assert.Equal(t, float64(1+flood), r.sc.Metric(t, laneRequests, nil), "the lane served the victim's turn and the flood")
		} else {
			assert.Equal(t, 0.0, r.sc.Metric(t, laneRequests, nil), "fasthttp served every request")
		}
		kept := r.sc.Metric(t, "pd_sidecar_multiturn_entries_total", map[string]string{"outcome": "kept"})
		require.Equal(t, float64(1+flood), kept, "every flood answer was kept, for a while")
		assert.Equal(t, float64(size), r.sc.Metric(t, "pd_sidecar_multiturn_entries", nil), "the store is full")
		assert.Equal(t, float64(flood-(size-1)), r.sc.Metric(t, "pd_sidecar_multiturn_evictions_total", map[string]string{"reason": "client_share"}),
			"the flood filled the free room, then gave its own oldest")
		assert.Equal(t, 0.0, r.sc.Metric(t, "pd_sidecar_multiturn_evictions_total", map[string]string{"reason": "full"}), "nothing went for lack of a client over its share")

		msgs := append(append([]map[string]any{}, first...), a.message(false), user(71, 60))
		before := r.counts(t)
		got := r.chatTurn(t, msgs, "victim", false, false)
		after := r.counts(t)
		assert.Equal(t, before.uses+1, after.uses, "the victim's turn used its history")
		assert.Greater(t, after.pulledBlocks, before.pulledBlocks, "the prefiller pulled the history's blocks")
		assert.True(t, r.lastPrefillHistory(t), "the prefill leg carried the history")
		assert.Equal(t, r.localTurn(t, msgs).content, got.content, "token-exact against a local run")
	})
}
