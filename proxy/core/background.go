package core

import "context"

// Background is work a sidecar does beside serving requests: warm-ups of new
// prefillers, probes of open circuits, release legs of KV nobody read,
// revalidations of MoRI-IO host names. Run runs each for as long as it
// serves.
type Background interface {
	// Run does the work until ctx is done, then returns once everything it
	// started has stopped. It may return before ctx is done when it has
	// nothing to do.
	Run(ctx context.Context)
}

// backgroundWork is one entry of a sidecar's background work.
type backgroundWork struct {
	Background
	// throughDrain: the requests still in flight use it (to send release
	// legs, to resolve hosts), so the end of Run's ctx, which begins the
	// shutdown, does not end it; it stops once they have drained. Without
	// it the work stops when the shutdown begins.
	ThroughDrain bool
}

// workers runs background work, each in a goroutine of its own, and stops
// it. It belongs to one goroutine (Run's): start and stop are not safe for
// concurrent use.
type Workers struct {
	running []runningWorker
}

type runningWorker struct {
	cancel context.CancelFunc
	done   <-chan struct{} // closed when its Run has returned
}

// start runs w.Run in a goroutine of its own, with a context of its own
// under ctx: it ends when ctx does, or at stop.
func (ws *Workers) Start(ctx context.Context, w Background) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	ws.running = append(ws.running, runningWorker{cancel: cancel, done: done})
}

// stop ends the workers the last started first, as deferred stops would
// run: it cancels each one's context and waits for its Run to return
// before it cancels the next. A worker that has returned already is not
// waited for. Once stopped, stop does nothing.
func (ws *Workers) Stop() {
	for i := len(ws.running) - 1; i >= 0; i-- {
		w := ws.running[i]
		w.cancel()
		<-w.done
	}
	ws.running = nil
}
