package kvbench

import (
	"context"
	"fmt"
	"time"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// tcpPull moves total bytes in blocks of bs with the tcp transport's real
// pull path in this process (an agent holding a region's blocks, a puller
// with streams connections: open, reads written with writev from the
// region and read straight into distinct destination blocks, complete),
// without checksums, as the raw copy beside it has none.
func tcpPull(ctx context.Context, total, bs, streams int) Result {
	n := max(1, total/bs)
	src, err := kvtransfer.NewMemRegion("bench-src", n, bs)
	if err != nil {
		return Result{Note: err.Error()}
	}
	defer src.Close()
	dst, err := kvtransfer.NewMemRegion("bench-dst", n, bs)
	if err != nil {
		return Result{Note: err.Error()}
	}
	defer dst.Close()
	mem := src.Mem()
	for i := range mem {
		mem[i] = byte(i)
	}
	clear(dst.Mem()) // fault the destination in, as an engine's region is
	agent := kvtransfer.NewAgent(kvtransfer.AgentConfig{EngineID: "bench"})
	agent.Register(src)
	tr := kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l, err := tr.Listen(ctx, "127.0.0.1:0", agent)
	if err != nil {
		return Result{Note: err.Error()}
	}
	defer l.Close()
	p, err := kvtransfer.NewPuller(tr, kvtransfer.PullerConfig{Streams: streams, SkipChecksums: true})
	if err != nil {
		return Result{Note: err.Error()}
	}
	defer p.Close()
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	blocks, err := dst.Blocks(ids)
	if err != nil {
		return Result{Note: err.Error()}
	}
	var best time.Duration
	for round := range 2 { // the first round dials the connections
		s, err := agent.Hold(kvtransfer.Hold{RequestID: fmt.Sprintf("bench-%d", round), Region: src, BlockIDs: ids, NumTokens: n})
		if err != nil {
			return Result{Note: err.Error()}
		}
		s.Agent, s.Transport = l.Addr(), tr.Name()
		st, err := p.Pull(ctx, s, blocks)
		if err != nil {
			return Result{Note: err.Error()}
		}
		if round > 0 {
			best = st.Duration
		}
	}
	return Result{GBps: float64(n*bs) / best.Seconds() / 1e9}
}
