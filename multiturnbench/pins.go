package multiturnbench

import (
	"context"
	"sync"
	"time"
)

// sidecarPinnedGauge is the sidecar's estimate of the tokens the decode
// engine holds pinned for histories, where the sidecar exports it.
const sidecarPinnedGauge = "pd_sidecar_multiturn_pinned_tokens"

// sample is one instant of the pinned KV, at since the mode's first turn.
type sample struct {
	at time.Duration
	// held is the decode engine's sim_kv_blocks_held: its pins (a decode
	// engine holds no KV for remote decoders).
	held float64
	// estimate is the sidecar's pd_sidecar_multiturn_pinned_tokens, valid
	// when estimated.
	estimate  float64
	estimated bool
	// ok: the decode engine answered the scrape.
	ok bool
}

// pinnedSeries is what a mode's sampler saw: samples from the first turn
// to the end of the tail.
type pinnedSeries struct {
	samples []sample
	// lastAnswer is when the last turn's last answer arrived, end when the
	// sampling stopped (both since the first turn).
	lastAnswer, end time.Duration
}

// sampler scrapes the decode engine and the sidecar every interval until
// stopped. Scrapes that fail are kept as gaps (ok false), not errors.
type sampler struct {
	t0     time.Time
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	samples []sample
}

func startSampler(ctx context.Context, decode, side endpoint, every time.Duration) *sampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &sampler{t0: time.Now(), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.take(ctx, decode, side)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// take scrapes once, each scrape bounded by a second.
func (s *sampler) take(ctx context.Context, decode, side endpoint) {
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	sm := sample{at: time.Since(s.t0)}
	if dm, err := scrape(sctx, decode.metrics()); err == nil {
		sm.held, sm.ok = dm.Value("sim_kv_blocks_held", nil), true
	}
	if m, err := scrape(sctx, side.metrics()); err == nil {
		if _, ok := m[sidecarPinnedGauge]; ok {
			sm.estimate, sm.estimated = m.Value(sidecarPinnedGauge, nil), true
		}
	}
	if ctx.Err() != nil && !sm.ok {
		return // stopped mid-scrape
	}
	s.mu.Lock()
	s.samples = append(s.samples, sm)
	s.mu.Unlock()
}

// waitDrained waits until a sample shows no block held or bound has
// passed, and returns the blocks the last sample held.
func (s *sampler) waitDrained(ctx context.Context, bound time.Duration) int {
	deadline := time.Now().Add(bound)
	for {
		s.mu.Lock()
		var last sample
		if n := len(s.samples); n > 0 {
			last = s.samples[n-1]
		}
		s.mu.Unlock()
		if (last.ok && last.held == 0) || !time.Now().Before(deadline) || ctx.Err() != nil {
			return int(last.held)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the sampling and returns the series.
func (s *sampler) stop() pinnedSeries {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return pinnedSeries{samples: s.samples, end: time.Since(s.t0)}
}

// pinCost is what a mode's pins held, sampled and attributed.
type pinCost struct {
	// Sampled: block·seconds held (trapezoids between samples), the
	// peak, and the blocks held at the last sample.
	blockSeconds, peak, heldAtEnd float64
	// The sidecar's estimate, sampled at the same instants: token·seconds
	// and peak (seen: the gauge was exported).
	estTokenSeconds, estPeak float64
	estSeen                  bool
	// From the ledgers, pin by pin: a pin lives from its answer's end to
	// the next turn's send when that turn pulled its history (read), else
	// to its TTL, clipped to the sampling's end. Never-read pins are
	// the abandoned conversations' first turns, the last turns, and lost
	// ones (a next turn that pulled no history: the sidecar had no entry
	// for it).
	pins                        int
	read, abandoned, last, lost pinShare
	afterEnd                    float64 // block·s the pins held at the end still hold until their TTL
}

// pinShare is a class of pins: how many and their block·seconds.
type pinShare struct {
	n            int
	blockSeconds float64
}

func (p pinCost) attributed() float64 {
	return p.read.blockSeconds + p.neverRead()
}

func (p pinCost) neverRead() float64 {
	return p.abandoned.blockSeconds + p.last.blockSeconds + p.lost.blockSeconds
}

// integrate sums the samples: block·seconds, peak and last value of the
// decode engine's held blocks, and the same of the sidecar's estimate.
func (c *pinCost) integrate(ss []sample) {
	var prev, prevEst *sample
	for i := range ss {
		s := &ss[i]
		if s.ok {
			if prev != nil {
				c.blockSeconds += (prev.held + s.held) / 2 * (s.at - prev.at).Seconds()
			}
			c.peak = max(c.peak, s.held)
			c.heldAtEnd = s.held
			prev = s
		}
		if s.estimated {
			c.estSeen = true
			if prevEst != nil {
				c.estTokenSeconds += (prevEst.estimate + s.estimate) / 2 * (s.at - prevEst.at).Seconds()
			}
			c.estPeak = max(c.estPeak, s.estimate)
			prevEst = s
		}
	}
}

// attribute splits the pins the ledgers recorded into read and never-read
// classes; ttl is the decode engine's, end the sampling's end.
func (c *pinCost) attribute(turns [][]*turnRec, abandoned []bool, ttl, end time.Duration) {
	for conv, recs := range turns {
		for k, r := range recs {
			if r.pinnedBlocks == 0 {
				continue
			}
			c.pins++
			blocks := float64(r.pinnedBlocks)
			if k+1 < len(recs) && recs[k+1].history > 0 {
				c.read.n++
				c.read.blockSeconds += blocks * max(0, recs[k+1].sent-r.ended).Seconds()
				continue
			}
			expiry := r.ended + ttl
			life := max(0, min(expiry, end)-r.ended).Seconds() * blocks
			c.afterEnd += max(0, expiry-end).Seconds() * blocks
			share := &c.lost
			switch {
			case k == 0 && conv < len(abandoned) && abandoned[conv]:
				share = &c.abandoned
			case k+1 == len(recs):
				share = &c.last
			}
			share.n++
			share.blockSeconds += life
		}
	}
}
