// Package spanbatch is an OpenTelemetry span processor that hands ended
// spans to an exporter in batches, as the SDK's batch span processor does,
// without waking a goroutine for each span: an ended span is appended to a
// queue under a lock, and the exporting goroutine wakes only when a batch
// is full or the schedule delay has passed. The SDK's processor sends each
// span over a channel to a goroutine that, at a serving sidecar's rates,
// is parked between spans, so every span costs a goroutine wake-up and a
// thread hand-off; here a batch of them costs one.
//
// It reads the SDK's batch settings from the environment
// (OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
// OTEL_BSP_EXPORT_TIMEOUT, in milliseconds) with the SDK's defaults; the
// schedule delay is the caller's.
package spanbatch

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Config is a Processor's batching.
type Config struct {
	// Delay is the longest a span waits in the queue before it is exported
	// (the schedule delay).
	Delay time.Duration
	// MaxQueue is how many ended spans wait at most; a span ended with the
	// queue full is dropped and counted.
	MaxQueue int
	// MaxBatch is how many spans one export carries at most; a queue that
	// reaches it is exported at once.
	MaxBatch int
	// ExportTimeout bounds one export.
	ExportTimeout time.Duration
}

// The SDK's defaults (go.opentelemetry.io/otel/sdk/trace: DefaultScheduleDelay,
// DefaultMaxQueueSize, DefaultMaxExportBatchSize, DefaultExportTimeout).
const (
	defaultDelay         = 5 * time.Second
	defaultMaxQueue      = 2048
	defaultMaxBatch      = 512
	defaultExportTimeout = 30 * time.Second
)

// ConfigFromEnv is the configuration with schedule delay delay and the
// rest from getenv's OTEL_BSP_* values, or the SDK's defaults where one
// is unset or not a positive integer. A batch is never larger than the
// queue.
func ConfigFromEnv(delay time.Duration, getenv func(string) string) Config {
	c := Config{Delay: delay, MaxQueue: defaultMaxQueue, MaxBatch: defaultMaxBatch, ExportTimeout: defaultExportTimeout}
	if n, ok := positive(getenv("OTEL_BSP_MAX_QUEUE_SIZE")); ok {
		c.MaxQueue = n
	}
	if n, ok := positive(getenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")); ok {
		c.MaxBatch = n
	}
	if n, ok := positive(getenv("OTEL_BSP_EXPORT_TIMEOUT")); ok {
		c.ExportTimeout = time.Duration(n) * time.Millisecond
	}
	c.MaxBatch = min(c.MaxBatch, c.MaxQueue)
	return c
}

// positive parses s as a positive integer.
func positive(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0
}

// Processor is a batching span processor (sdktrace.SpanProcessor). Safe
// for concurrent use.
type Processor struct {
	exp sdktrace.SpanExporter
	cfg Config

	mu      sync.Mutex
	queue   []sdktrace.ReadOnlySpan
	dropped int // spans dropped since the last export, queue full
	closed  bool

	// exporting serializes exports (the goroutine's, ForceFlush's,
	// Shutdown's), and spare is the slice the queue is swapped with.
	exporting sync.Mutex
	spare     []sdktrace.ReadOnlySpan

	full chan struct{} // a batch is waiting (capacity 1)
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

var _ sdktrace.SpanProcessor = (*Processor)(nil)

// New starts a processor exporting through exp as c says. Register it
// with sdktrace.WithSpanProcessor; the tracer provider's Shutdown shuts it
// down, exporting what is queued.
func New(exp sdktrace.SpanExporter, c Config) *Processor {
	if c.Delay <= 0 {
		c.Delay = defaultDelay
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = defaultMaxQueue
	}
	if c.MaxBatch <= 0 || c.MaxBatch > c.MaxQueue {
		c.MaxBatch = min(defaultMaxBatch, c.MaxQueue)
	}
	if c.ExportTimeout <= 0 {
		c.ExportTimeout = defaultExportTimeout
	}
	p := &Processor{exp: exp, cfg: c,
		queue: make([]sdktrace.ReadOnlySpan, 0, c.MaxBatch), spare: make([]sdktrace.ReadOnlySpan, 0, c.MaxBatch),
		full: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

// OnStart does nothing: spans are queued when they end.
func (p *Processor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues s, if sampled, and wakes the exporting goroutine only when
// the queue holds a whole batch.
func (p *Processor) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	p.mu.Lock()
	if p.closed || len(p.queue) >= p.cfg.MaxQueue {
		p.dropped++
		p.mu.Unlock()
		return
	}
	p.queue = append(p.queue, s)
	n := len(p.queue)
	p.mu.Unlock()
	if n >= p.cfg.MaxBatch {
		select {
		case p.full <- struct{}{}:
		default: // already signalled
		}
	}
}

// run exports the queue when a batch is full or the delay has passed,
// until Shutdown.
func (p *Processor) run() {
	defer close(p.done)
	t := time.NewTimer(p.cfg.Delay)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.full:
		case <-t.C:
		}
		if err := p.export(context.Background()); err != nil {
			otel.Handle(err)
		}
		t.Reset(p.cfg.Delay)
	}
}

// export exports every span queued, a batch at a time, and reports the
// spans dropped since the last export to OpenTelemetry's error handler.
// It returns the first export's failure.
func (p *Processor) export(ctx context.Context) error {
	p.exporting.Lock()
	defer p.exporting.Unlock()
	p.mu.Lock()
	batch, dropped := p.queue, p.dropped
	p.queue, p.dropped = p.spare[:0], 0
	p.mu.Unlock()
	var first error
	for spans := batch; len(spans) > 0; {
		n := min(len(spans), p.cfg.MaxBatch)
		ectx, cancel := context.WithTimeout(ctx, p.cfg.ExportTimeout)
		err := p.exp.ExportSpans(ectx, spans[:n])
		cancel()
		if err != nil && first == nil {
			first = fmt.Errorf("spanbatch: export: %w", err)
		}
		clear(spans[:n]) // let the spans go
		spans = spans[n:]
	}
	p.spare = batch[:0]
	if dropped > 0 {
		otel.Handle(fmt.Errorf("spanbatch: %d spans dropped: queue full (OTEL_BSP_MAX_QUEUE_SIZE=%d)", dropped, p.cfg.MaxQueue))
	}
	return first
}

// ForceFlush exports every span queued now.
func (p *Processor) ForceFlush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return p.export(ctx)
}

// Shutdown stops the exporting goroutine, exports what is queued and
// shuts the exporter down; spans ending after it are dropped. Only the
// first call does anything.
func (p *Processor) Shutdown(ctx context.Context) error {
	var err error
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.stop)
		select {
		case <-p.done:
		case <-ctx.Done():
			err = ctx.Err()
			return
		}
		err = p.export(ctx)
		if serr := p.exp.Shutdown(ctx); serr != nil && err == nil {
			err = serr
		}
	})
	return err
}
