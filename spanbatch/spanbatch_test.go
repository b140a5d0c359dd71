package spanbatch_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pd-sidecar/pd-sidecar/spanbatch"
)

// exporter records the batches exported; with gate set, each export
// tells entered its size, then waits for gate first.
type exporter struct {
	mu       sync.Mutex
	batches  []int
	names    []string
	gate     chan struct{}
	entered  chan int
	shutdown int
}

func (e *exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if e.gate != nil {
		e.entered <- len(spans)
		select {
		case <-e.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.batches = append(e.batches, len(spans))
	for _, s := range spans {
		e.names = append(e.names, s.Name())
	}
	return nil
}

func (e *exporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shutdown++
	return nil
}

func (e *exporter) got() (batches []int, names []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.batches...), append([]string(nil), e.names...)
}

// recordOnly records every span without sampling it.
type recordOnly struct{}

func (recordOnly) ShouldSample(sdktrace.SamplingParameters) sdktrace.SamplingResult {
	return sdktrace.SamplingResult{Decision: sdktrace.RecordOnly}
}
func (recordOnly) Description() string { return "record only" }

// end starts and ends n spans named name on tp.
func end(tp *sdktrace.TracerProvider, name string, n int) {
	tr := tp.Tracer("t")
	for range n {
		_, s := tr.Start(context.Background(), name)
		s.End()
	}
}

// errs collects what OpenTelemetry's error handler is told while a test
// runs.
type errs struct {
	mu   sync.Mutex
	list []string
}

func (e *errs) Handle(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, err.Error())
}

func (e *errs) all() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.list...)
}

func handleErrors(t *testing.T) *errs {
	e := &errs{}
	otel.SetErrorHandler(e)
	t.Cleanup(func() { otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {})) })
	return e
}

// TestBatches: a full batch is exported at once, with no wait for the
// delay; the rest waits for the delay or for Shutdown, which exports it
// and shuts the exporter down; spans ending after Shutdown are dropped.
func TestBatches(t *testing.T) {
	tests := []struct {
		name     string
		delay    time.Duration
		spans    int
		before   []int // batches exported before Shutdown
		after    []int // all batches once Shutdown returned
		exported int
	}{
		{"full batches go at once", time.Hour, 7, []int{3, 3}, []int{3, 3, 1}, 7},
		{"the delay sends a partial batch", 20 * time.Millisecond, 2, []int{2}, []int{2}, 2},
		{"Shutdown sends what waits", time.Hour, 2, nil, []int{2}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exp := &exporter{}
			p := spanbatch.New(exp, spanbatch.Config{Delay: tc.delay, MaxQueue: 100, MaxBatch: 3})
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p))
			for i := range tc.spans {
				end(tp, "s", 1)
				if i%3 == 2 { // each full batch exported before the next span ends
					require.Eventually(t, func() bool { b, _ := exp.got(); return len(b) == (i+1)/3 }, 5*time.Second, time.Millisecond)
				}
			}
			if tc.before != nil {
				require.Eventually(t, func() bool { b, _ := exp.got(); return len(b) == len(tc.before) }, 5*time.Second, time.Millisecond)
				b, _ := exp.got()
				assert.Equal(t, tc.before, b)
			} else {
				time.Sleep(20 * time.Millisecond)
				b, _ := exp.got()
				assert.Empty(t, b, "nothing full, the delay not passed")
			}
			require.NoError(t, tp.Shutdown(context.Background()))
			b, names := exp.got()
			assert.Equal(t, tc.after, b)
			assert.Len(t, names, tc.exported)
			assert.Equal(t, 1, exp.shutdown)
			end(tp, "late", 1)
			require.NoError(t, p.Shutdown(context.Background()), "a second Shutdown does nothing")
			_, names = exp.got()
			assert.NotContains(t, names, "late")
			assert.Equal(t, 1, exp.shutdown)
		})
	}
}

// TestQueueFullDrops: spans ending while the queue is full are dropped,
// counted and reported to OpenTelemetry's error handler; the others are
// all exported.
func TestQueueFullDrops(t *testing.T) {
	reported := handleErrors(t)
	exp := &exporter{gate: make(chan struct{}), entered: make(chan int, 8)}
	p := spanbatch.New(exp, spanbatch.Config{Delay: time.Hour, MaxQueue: 3, MaxBatch: 3})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p))
	end(tp, "first", 3) // a full batch: its export waits on the gate
	select {
	case n := <-exp.entered:
		require.Equal(t, 3, n, "the export took the whole queue")
	case <-time.After(5 * time.Second):
		t.Fatal("a full batch was not exported")
	}
	assert.Empty(t, reported.all())
	end(tp, "second", 3) // fills the queue again
	end(tp, "dropped", 2)
	close(exp.gate)
	require.NoError(t, tp.Shutdown(context.Background()))
	b, names := exp.got()
	assert.Equal(t, []int{3, 3}, b)
	assert.NotContains(t, names, "dropped")
	require.NotEmpty(t, reported.all())
	assert.Contains(t, strings.Join(reported.all(), "\n"), "2 spans dropped: queue full")
}

// TestForceFlushAndSampling: ForceFlush exports what waits at once;
// spans recorded but not sampled are never exported.
func TestForceFlushAndSampling(t *testing.T) {
	exp := &exporter{}
	p := spanbatch.New(exp, spanbatch.Config{Delay: time.Hour, MaxQueue: 100, MaxBatch: 50})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p))
	end(tp, "sampled", 2)
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p), sdktrace.WithSampler(recordOnly{}))
	end(unsampled, "unsampled", 2)
	require.NoError(t, p.ForceFlush(context.Background()))
	b, names := exp.got()
	assert.Equal(t, []int{2}, b)
	assert.Equal(t, []string{"sampled", "sampled"}, names)
	require.NoError(t, tp.Shutdown(context.Background()))
}

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want spanbatch.Config
	}{
		{"the SDK's defaults", nil, spanbatch.Config{Delay: time.Second, MaxQueue: 2048, MaxBatch: 512, ExportTimeout: 30 * time.Second}},
		{"set", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "4096", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "256", "OTEL_BSP_EXPORT_TIMEOUT": "1500"},
			spanbatch.Config{Delay: time.Second, MaxQueue: 4096, MaxBatch: 256, ExportTimeout: 1500 * time.Millisecond}},
		{"not positive integers: the defaults", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "-1", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "x", "OTEL_BSP_EXPORT_TIMEOUT": "0"},
			spanbatch.Config{Delay: time.Second, MaxQueue: 2048, MaxBatch: 512, ExportTimeout: 30 * time.Second}},
		{"a batch is never larger than the queue", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "100"},
			spanbatch.Config{Delay: time.Second, MaxQueue: 100, MaxBatch: 100, ExportTimeout: 30 * time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, spanbatch.ConfigFromEnv(time.Second, func(k string) string { return tc.env[k] }))
		})
	}
}
