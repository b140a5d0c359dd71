package proxy

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// fakeTargets lists fixed prefillers and records the probes' results.
type fakeTargets struct {
	list []string
	mu   sync.Mutex
	got  map[string]bool
	lim  int
}

func (f *fakeTargets) probeList(limit int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lim = limit
	return f.list[:min(limit, len(f.list))]
}

func (f *fakeTargets) probed(hp string, up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got[hp] = up
}

func TestCircuitProberRound(t *testing.T) {
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
			pr := &circuitProber{targets: f, interval: time.Second, timeout: 20 * time.Millisecond, limit: tc.limit,
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
			pr.round(context.Background())
			assert.Equal(t, tc.want, f.got)
			assert.Equal(t, tc.limit, f.lim)
		})
	}
}

func TestCircuitProberStopsWithItsContext(t *testing.T) {
	f := &fakeTargets{list: []string{"a:1"}, got: map[string]bool{}}
	dialing := make(chan struct{}, 1)
	pr := &circuitProber{targets: f, interval: time.Millisecond, timeout: time.Minute, limit: 64,
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

func TestNewCircuitProber(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int
		interval time.Duration
		connect  time.Duration
		timeout  time.Duration // 0: no prober
	}{
		{"default", 3, 250 * time.Millisecond, 2 * time.Second, 125 * time.Millisecond},
		{"bounded by --connect-timeout", 3, time.Second, 100 * time.Millisecond, 100 * time.Millisecond},
		{"probing off", 3, 0, time.Second, 0},
		{"no breaker", 0, 250 * time.Millisecond, time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := circuit.DefaultConfig()
			cfg.Failures, cfg.ProbeInterval = tc.failures, tc.interval
			g, err := newGuard(GuardConfig{Breaker: cfg}, 0, metrics.NewGuards(prometheus.NewRegistry()), zerolog.Nop())
			require.NoError(t, err)
			pr := newCircuitProber(g, tc.connect)
			if tc.timeout == 0 {
				assert.Nil(t, pr)
				return
			}
			require.NotNil(t, pr)
			assert.Equal(t, tc.timeout, pr.timeout)
			assert.Equal(t, tc.interval, pr.interval)
			assert.Equal(t, maxProbesPerRound, pr.limit)
		})
	}
}

// TestCircuitProberOverGuard: a prefiller that refused connections is probed
// over real sockets; while nothing listens the probes count down and the
// circuit stays open; once it listens again one probe counts up, the next
// request is the trial, and its success closes the circuit and the
// open-circuits gauge with it.
func TestCircuitProberOverGuard(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hp := ln.Addr().String()
	require.NoError(t, ln.Close())

	cfg := circuit.Config{Failures: 2, Cooldown: time.Hour, ProbeInterval: 100 * time.Millisecond, MaxTracked: 16}
	m := metrics.NewGuards(prometheus.NewRegistry())
	g, err := newGuard(GuardConfig{Breaker: cfg}, 0, m, zerolog.Nop())
	require.NoError(t, err)
	for range 2 {
		tk, ok := g.breakers.Allow(hp)
		require.True(t, ok)
		tk.Done(breakerResult(prefillTransportErr(errors.New("connect: connection refused"))))
		g.trackCircuit(hp)
	}
	require.Equal(t, circuit.Open, g.breakers.State(hp))
	require.Equal(t, 1.0, testutil.ToFloat64(m.CircuitOpen))

	pr := newCircuitProber(g, time.Second)
	pr.round(context.Background())
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitProbes.WithLabelValues(metrics.ProbeDown)))
	_, ok := g.breakers.Allow(hp)
	assert.False(t, ok, "still down: still skipped")

	back, err := net.Listen("tcp", hp)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	defer back.Close()
	pr.round(context.Background())
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitProbes.WithLabelValues(metrics.ProbeUp)))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitOpen), "open until the trial succeeds")
	pr.round(context.Background())
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitProbes.WithLabelValues(metrics.ProbeUp)), "found up: not probed again")

	tk, ok := g.breakers.Allow(hp)
	require.True(t, ok, "the next request is the trial, long before the cool-down ends")
	tk.Done(breakerResult(nil))
	g.trackCircuit(hp)
	assert.Equal(t, circuit.Closed, g.breakers.State(hp))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.CircuitOpen))
}
