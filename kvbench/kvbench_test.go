package kvbench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParsePerftest(t *testing.T) {
	for _, tc := range []struct {
		name string
		out  string
		gbps float64
		ok   bool
	}{
		// ucx_perftest 1.13's last line, UCX_TLS=sm,self, 256 KiB gets.
		{"final line", "+------+\n|  Stage  |\nFinal:                  2000      7.610    12.201    12.201    20490.21   20490.21       81961       81961\n", 20490.21 * (1 << 20) / 1e9, true},
		{"refused", "[1] UCX  ERROR ucp_ep_create() failed: Destination is unreachable\n", 0, false},
		{"short final line", "Final: 2000 7.6\n", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gbps, ok := parsePerftest([]byte(tc.out))
			assert.Equal(t, tc.ok, ok)
			assert.InDelta(t, tc.gbps, gbps, 1e-9)
		})
	}
}

// The in-process paths move real bytes: a pull over the tcp transport, the
// raw copy and the memory copy each report a rate.
func TestInProcessPathsMoveBytes(t *testing.T) {
	for name, f := range map[string]func() Result{
		"tcp pull, 1 connection":  func() Result { return tcpPull(context.Background(), 4<<20, 64<<10, 1) },
		"tcp pull, 4 connections": func() Result { return tcpPull(context.Background(), 4<<20, 1<<20, 4) },
		"raw copy":                func() Result { return rawCopy(context.Background(), 4<<20, 64<<10) },
		"memory copy":             func() Result { return memCopy(8 << 20) },
	} {
		r := f()
		assert.Empty(t, r.Note, name)
		assert.Positive(t, r.GBps, name)
	}
}

func TestBestKeepsTheHighestAndNotesWhy(t *testing.T) {
	rs := []Result{{Note: "refused"}, {GBps: 2}, {GBps: 1}}
	i := 0
	o := Options{Repeat: 3}
	b := o.best(func() Result { r := rs[i]; i++; return r })
	assert.Equal(t, 2.0, b.GBps)
	var n notes
	n.add("x", Result{Note: "a"})
	n.add("x", Result{Note: "a"})
	n.add("x", Result{GBps: 1, Note: "ignored"})
	assert.Equal(t, notes{"x: a"}, n)
	assert.Equal(t, "n/a", Result{Note: "a"}.cell())
	assert.Equal(t, "-", ratio(Result{GBps: 1}, Result{}))
	assert.Equal(t, "0.50x", ratio(Result{GBps: 1}, Result{GBps: 2}))
}
