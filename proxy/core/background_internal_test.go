package core

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runBackground runs w as Run does, until the returned stop (also run at
// the end of t) cancels it and waits for it.
func runBackground(t *testing.T, w Background) (stop func()) {
	t.Helper()
	var ws Workers
	ws.Start(context.Background(), w)
	t.Cleanup(ws.Stop)
	return ws.Stop
}

// fakeWork is background work that records in a log, shared with
// others, when it ended: once its context is done, or at once when early.
type fakeWork struct {
	name  string
	early bool
	log   *eventLog
	done  chan struct{} // closed when Run has returned
}

func (f *fakeWork) Run(ctx context.Context) {
	defer close(f.done)
	if !f.early {
		<-ctx.Done()
		time.Sleep(time.Millisecond) // a stop that did not wait would miss the end
	}
	f.log.add(f.name + " ended")
}

type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(e string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) ended() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

func TestWorkers(t *testing.T) {
	tests := []struct {
		name  string
		work  []string        // started in this order
		early map[string]bool // returns without waiting for its context
		// parentDone: the context the work was started under ends before
		// stop; it alone ends the work.
		parentDone bool
		want       []string // the order the work ended in
	}{
		{name: "nothing to run"},
		{name: "one, until stopped", work: []string{"a"}, want: []string{"a ended"}},
		{name: "stopped the last started first", work: []string{"a", "b", "c"},
			want: []string{"c ended", "b ended", "a ended"}},
		{name: "one returns early, the others run until stopped", work: []string{"a", "b", "c"},
			early: map[string]bool{"b": true}, want: []string{"b ended", "c ended", "a ended"}},
		{name: "all return early", work: []string{"a", "b"}, early: map[string]bool{"a": true, "b": true},
			want: []string{"a ended", "b ended"}},
		{name: "the parent context ends them", work: []string{"a"}, parentDone: true, want: []string{"a ended"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log := &eventLog{}
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			var ws Workers
			for _, name := range tc.work {
				f := &fakeWork{name: name, early: tc.early[name], log: log, done: make(chan struct{})}
				ws.Start(parent, f)
				if f.early {
					<-f.done // so that those returning early end in start order
				}
			}
			for _, name := range tc.work {
				if !tc.early[name] {
					assert.NotContains(t, log.ended(), name+" ended", "running until stopped")
				}
			}
			if tc.parentDone {
				cancel()
				require.Eventually(t, func() bool { return len(log.ended()) == len(tc.work) }, 5*time.Second, time.Millisecond)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				ws.Stop()
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("stop did not return")
			}
			assert.Equal(t, tc.want, log.ended(), "each ended before stop returned, in this order")
			ws.Stop() // a second stop does nothing
			assert.Equal(t, tc.want, log.ended())
		})
	}
}
