package loadgen

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Load says how hard and how long to drive each target.
type Load struct {
	// Clients is the number of concurrent clients of a closed loop (each
	// sends its next request when the previous one ends).
	Clients int
	// Rate, when positive, makes an open loop: requests arrive at Rate per
	// second whatever the answers do, so queueing shows in the latencies.
	Rate float64
	// Poisson draws open-loop gaps from an exponential distribution
	// instead of a constant interval.
	Poisson bool
	// Duration is how long each target is driven per round.
	Duration time.Duration
	// Rounds interleaves the targets: every round runs each target once
	// for Duration, in an order of its own (a permutation seeded by the
	// round's number), so that machine noise hits all alike and no target
	// always follows the same one (a target can leave the shared engines
	// busy for the next: its own GC, connections closing).
	Rounds int
	// Warmup is run against every target before the first round and not
	// recorded.
	Warmup time.Duration
	// Timeout bounds each request's reads and writes.
	Timeout time.Duration
	// MaxOutstanding bounds open-loop requests in flight; arrivals past it
	// are counted as dropped.
	MaxOutstanding int
	// LeaveShare is the share (0..1) of requests whose client closes its
	// connection LeaveAfter after the request was due, unless the answer
	// ended before: clients that give up (Result.Left). The leaving
	// requests are spread evenly over each phase's requests (see leaves).
	LeaveShare float64
	LeaveAfter time.Duration
}

// Validate checks the load.
func (l Load) Validate() error {
	switch {
	case l.Rate <= 0 && l.Clients < 1:
		return errors.New("either clients >= 1 (closed loop) or a positive rate (open loop)")
	case l.Duration <= 0:
		return errors.New("duration must be positive")
	case l.Rounds < 1:
		return errors.New("rounds must be at least 1")
	case l.LeaveShare < 0 || l.LeaveShare > 1:
		return errors.New("leave share must be within 0..1")
	case l.LeaveShare > 0 && l.LeaveAfter <= 0:
		return errors.New("a leave share needs a positive leave-after time")
	}
	return nil
}

// leaves reports whether the phase's request number k (from 0) is one
// whose client leaves: of the first n requests, floor(n × LeaveShare)
// leave, so that a share of 0.1 makes every tenth request leave rather
// than a random tenth, and a short phase still has its share.
func (l Load) leaves(k uint64) bool {
	if l.LeaveShare <= 0 {
		return false
	}
	// The epsilon keeps products that are whole numbers in decimal (10 ×
	// 0.3) from landing just under them in binary.
	upTo := func(n uint64) uint64 { return uint64(float64(n)*l.LeaveShare + 1e-9) }
	return upTo(k+1) > upTo(k)
}

// Progress is told after every phase.
type Progress func(round, rounds int, target string, done int)

// Run drives every target with the load and returns the results, per
// target in the order given.
func Run(ctx context.Context, api API, targets []Target, reqs []Request, l Load, progress Progress) ([]*TargetResults, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if len(targets) == 0 || len(reqs) == 0 {
		return nil, errors.New("need at least one target and one request")
	}
	if l.Timeout <= 0 {
		l.Timeout = 60 * time.Second
	}
	if l.MaxOutstanding <= 0 {
		l.MaxOutstanding = 20000
	}
	clients := make([]*client, len(targets))
	out := make([]*TargetResults, len(targets))
	for i, t := range targets {
		clients[i] = newClient(t, api, l.Timeout)
		out[i] = &TargetResults{Target: t}
	}
	defer func() {
		for _, c := range clients {
			c.hc.CloseIdleConnections()
		}
	}()
	var next atomic.Uint64
	if l.Warmup > 0 {
		for i := range targets {
			warm := l
			warm.Duration = l.Warmup
			runPhase(ctx, clients[i], reqs, &next, warm)
		}
	}
	for round := 0; round < l.Rounds; round++ {
		order := rand.New(rand.NewPCG(uint64(round), 0x5eed)).Perm(len(targets))
		for _, i := range order {
			start := time.Now()
			res, dropped := runPhase(ctx, clients[i], reqs, &next, l)
			out[i].add(res, time.Since(start), dropped)
			if progress != nil {
				progress(round+1, l.Rounds, targets[i].Name, len(out[i].Results))
			}
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
		}
	}
	return out, nil
}

// runPhase drives one client for l.Duration; in-flight requests finish
// before it returns.
func runPhase(ctx context.Context, c *client, reqs []Request, next *atomic.Uint64, l Load) ([]Result, int) {
	ctx, cancel := context.WithTimeout(ctx, l.Duration)
	defer cancel()
	pick := func() []byte { return reqs[next.Add(1)%uint64(len(reqs))].Body }
	// send runs one request, as a leaving client when its number says so.
	var sent atomic.Uint64
	send := func(start time.Time, body []byte) Result {
		if l.leaves(sent.Add(1) - 1) {
			return c.leave(start, body, start.Add(l.LeaveAfter))
		}
		return c.do(start, body)
	}
	var mu sync.Mutex
	var all []Result
	var wg sync.WaitGroup
	if l.Rate <= 0 {
		for w := 0; w < l.Clients; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []Result
				for ctx.Err() == nil {
					mine = append(mine, send(time.Now(), pick()))
				}
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return all, 0
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var outstanding atomic.Int64
	dropped := 0
	due := time.Now()
	interval := time.Duration(float64(time.Second) / l.Rate)
	for {
		if l.Poisson {
			due = due.Add(time.Duration(rng.ExpFloat64() * float64(interval)))
		} else {
			due = due.Add(interval)
		}
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		if ctx.Err() != nil {
			break
		}
		if outstanding.Load() >= int64(l.MaxOutstanding) {
			dropped++
			continue
		}
		outstanding.Add(1)
		wg.Add(1)
		go func(start time.Time, body []byte) {
			defer wg.Done()
			defer outstanding.Add(-1)
			r := send(start, body)
			mu.Lock()
			all = append(all, r)
			mu.Unlock()
		}(due, pick())
	}
	wg.Wait()
	return all, dropped
}
