package circuitprobe

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// fakeTargets lists fixed prefillers and records the probes' results.
type fakeTargets struct {
	list []string
	mu   sync.Mutex
	got  map[string]bool
	lim  int
}

func (f *fakeTargets) ProbeList(limit int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lim = limit
	return f.list[:min(limit, len(f.list))]
}

func (f *fakeTargets) Probed(hp string, up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got[hp] = up
}

func TestRound(t *testing.T) {
	errRefused := errors.New("connection refused")
	tests := []struct {
		name  string
		list  []string
		limit int
		up    map[string]bool // what the fake dial finds
		hang  bool            // the dial waits for its context
		want  map[string]bool
	}{
		{"nothing open", nil, 64, nil, false, map[string]bool{}},
		{"up and down", []string{"a:1", "b:1"}, 64, map[string]bool{"a:1": true}, false, map[string]bool{"a:1": true, "b:1": false}},
		{"bounded per round", []string{"a:1", "b:1", "c:1"}, 2, map[string]bool{"a:1": true, "b:1": true, "c:1": true}, false,
			map[string]bool{"a:1": true, "b:1": true}},
		{"a silent host is down after the timeout", []string{"a:1"}, 64, nil, true, map[string]bool{"a:1": false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeTargets{list: tc.list, got: map[string]bool{}}
			pr := &Prober{targets: f, interval: time.Second, timeout: 20 * time.Millisecond, limit: tc.limit,
				dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
					assert.Equal(t, "tcp", network)
					if tc.hang {
						<-ctx.Done()
						return nil, ctx.Err()
					}
					if !tc.up[addr] {
						return nil, errRefused
					}
					c, s := net.Pipe()
					_ = s.Close()
					return c, nil
				}}
			pr.Round(context.Background())
			assert.Equal(t, tc.want, f.got)
			assert.Equal(t, tc.limit, f.lim)
		})
	}
}

func TestRunStopsWithItsContext(t *testing.T) {
	f := &fakeTargets{list: []string{"a:1"}, got: map[string]bool{}}
	dialing := make(chan struct{}, 1)
	pr := &Prober{targets: f, interval: time.Millisecond, timeout: time.Minute, limit: 64,
		dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			select {
			case dialing <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return nil, ctx.Err()
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		pr.Run(ctx)
	}()
	<-dialing
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the prober did not stop with its context")
	}
	assert.Empty(t, f.got, "a probe cut short by shutdown reports nothing")
}

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		connect  time.Duration
		timeout  time.Duration
	}{
		{"half the interval", 250 * time.Millisecond, 2 * time.Second, 125 * time.Millisecond},
		{"bounded by the connect timeout", time.Second, 100 * time.Millisecond, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := New(&fakeTargets{}, tc.interval, tc.connect)
			assert.Equal(t, tc.timeout, pr.timeout)
			assert.Equal(t, tc.interval, pr.interval)
			assert.Equal(t, maxPerRound, pr.limit)
			assert.NotNil(t, pr.dial)
		})
	}
}
