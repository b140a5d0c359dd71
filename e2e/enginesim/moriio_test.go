package enginesim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMoriInbox(t *testing.T) {
	kv := &pulled{numTokens: 3, blocks: [][]byte{{1}}}
	t.Run("written before the decode asks", func(t *testing.T) {
		m := newMoriIO(prometheus.NewRegistry(), "m", time.Minute)
		require.NoError(t, m.deliver("tx1", kv))
		got, err := m.take(context.Background(), "tx1", time.Second)
		require.NoError(t, err)
		assert.Same(t, kv, got)
		_, err = m.take(context.Background(), "tx1", 10*time.Millisecond)
		assert.Error(t, err, "taken once")
	})
	t.Run("written while the decode waits", func(t *testing.T) {
		m := newMoriIO(prometheus.NewRegistry(), "m", time.Minute)
		go func() {
			// Delivered once the decode waits for it.
			for {
				m.mu.Lock()
				_, waiting := m.inbox["tx2"]
				m.mu.Unlock()
				if waiting {
					break
				}
				time.Sleep(time.Millisecond)
			}
			_ = m.deliver("tx2", kv)
		}()
		got, err := m.take(context.Background(), "tx2", 30*time.Second)
		require.NoError(t, err)
		assert.Same(t, kv, got)
	})
	t.Run("never written: bounded wait", func(t *testing.T) {
		m := newMoriIO(prometheus.NewRegistry(), "m", time.Minute)
		_, err := m.take(context.Background(), "tx3", 20*time.Millisecond)
		assert.True(t, errors.Is(err, errMoriWait), "%v", err)
		m.mu.Lock()
		assert.Empty(t, m.inbox, "the waiter's slot is dropped")
		m.mu.Unlock()
	})
	t.Run("written twice: refused", func(t *testing.T) {
		m := newMoriIO(prometheus.NewRegistry(), "m", time.Minute)
		require.NoError(t, m.deliver("tx4", kv))
		assert.Error(t, m.deliver("tx4", kv))
	})
	t.Run("never decoded: dropped after the lease", func(t *testing.T) {
		m := newMoriIO(prometheus.NewRegistry(), "m", 10*time.Millisecond)
		require.NoError(t, m.deliver("tx5", kv))
		require.Eventually(t, func() bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return len(m.inbox) == 0
		}, 30*time.Second, time.Millisecond)
	})
}
