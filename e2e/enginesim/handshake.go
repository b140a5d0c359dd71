package enginesim

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// handshakes is a decode engine's record of the prefiller engines it is
// connected to, standing in for NIXL's handshake: before its first pull from
// a prefiller engine (keyed by the remote_engine_id of the nixl
// kv_transfer_params) a vLLM decoder fetches that engine's agent metadata
// and connects to it, which takes seconds, and every later pull from it
// reuses the connection. Here the first pull from an engine starts a
// handshake of Config.KVHandshakeDelay, counted; pulls that arrive while it
// runs wait for the same handshake, and once it is done the engine stays
// connected for this engine's life. A handshake runs on even when the pull
// that started it is cancelled, as a real agent's does.
type handshakes struct {
	delay time.Duration
	count prometheus.Counter

	mu    sync.Mutex
	peers map[string]chan struct{} // by remote_engine_id; closed once connected
}

func newHandshakes(delay time.Duration, count prometheus.Counter) *handshakes {
	return &handshakes{delay: delay, count: count, peers: map[string]chan struct{}{}}
}

// connect returns once this engine is connected to the prefiller engine
// engineID, starting the handshake when none was, or with ctx's error when
// ctx ends first.
func (h *handshakes) connect(ctx context.Context, engineID string) error {
	h.mu.Lock()
	done, ok := h.peers[engineID]
	if !ok {
		done = make(chan struct{})
		h.peers[engineID] = done
		h.count.Inc()
		if h.delay > 0 {
			time.AfterFunc(h.delay, func() { close(done) })
		} else {
			close(done)
		}
	}
	h.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
