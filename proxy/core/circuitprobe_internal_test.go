package core

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
)

func TestNewCircuitProber(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int
		interval time.Duration
		connect  time.Duration
		on       bool
	}{
		{"default", 3, 250 * time.Millisecond, 2 * time.Second, true},
		{"probing off", 3, 0, time.Second, false},
		{"no breaker", 0, 250 * time.Millisecond, time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := circuit.DefaultConfig()
			cfg.Failures, cfg.ProbeInterval = tc.failures, tc.interval
			g, err := newGuard(guard.Config{Breaker: cfg}, 0, metrics.NewGuards(prometheus.NewRegistry()), zerolog.Nop())
			require.NoError(t, err)
			pr := newCircuitProber(g, tc.connect)
			assert.Equal(t, tc.on, pr != nil)
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
	g, err := newGuard(guard.Config{Breaker: cfg}, 0, m, zerolog.Nop())
	require.NoError(t, err)
	for range 2 {
		tk, err := g.AllowPrefill(hp)
		require.NoError(t, err)
		g.BreakerDone(hp, tk, PrefillTransportErr(errors.New("connect: connection refused")))
	}
	require.Equal(t, circuit.Open, g.CircuitInfo(hp).State)
	require.Equal(t, 1.0, testutil.ToFloat64(m.CircuitOpen))

	pr := newCircuitProber(g, time.Second)
	pr.Round(context.Background())
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitProbes.WithLabelValues(metrics.ProbeDown)))
	_, err = g.AllowPrefill(hp)
	assert.ErrorIs(t, err, guard.ErrCircuitOpen, "still down: still skipped")

	back, err := net.Listen("tcp", hp)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	defer back.Close()
	pr.Round(context.Background())
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitProbes.WithLabelValues(metrics.ProbeUp)))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitOpen), "open until the trial succeeds")
	pr.Round(context.Background())
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CircuitProbes.WithLabelValues(metrics.ProbeUp)), "found up: not probed again")

	tk, err := g.AllowPrefill(hp)
	require.NoError(t, err, "the next request is the trial, long before the cool-down ends")
	g.BreakerDone(hp, tk, nil)
	assert.Equal(t, circuit.Closed, g.CircuitInfo(hp).State)
	assert.Equal(t, 0.0, testutil.ToFloat64(m.CircuitOpen))
}
