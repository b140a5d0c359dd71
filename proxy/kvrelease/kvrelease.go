// Package kvrelease sends release legs in the background: requests whose
// only purpose is to make an engine free KV blocks it holds for a reader
// that will never come. Two kinds: minimal decode legs
// (--release-kv-on-cancel) for requests that ended while the prefill engine
// still held their KV for a decoder that never read it, so that the decode
// engine reads the blocks and the prefill engine frees them at once instead
// of at its own timeout; and minimal prefill legs for multi-turn histories
// the decode engine pinned that no turn will read (PinLegs). Which requests
// need one, and what the leg says, are the caller's; this package bounds
// the legs in flight and the time each takes, reads and discards their
// answers, counts how they went, and stops them all at the end of Run.
package kvrelease

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

const (
	// maxInFlight bounds the release legs in flight; past it a release
	// is not sent (counted over_limit), so that a wave of leaving clients
	// cannot load the decode engine with more than this many extra decodes.
	maxInFlight = 16
	// timeout bounds one release leg, from connect to the end of its
	// answer: the KV pull and one decode step on a loaded engine.
	timeout = 30 * time.Second
)

// Kind is what a Releaser's legs release: how its log lines name it and
// its counter's labels.
type Kind struct {
	// What is released ("prefiller KV"), and Holder the engine that frees
	// it by itself at a timeout otherwise ("the prefiller").
	What, Holder string
	// Done, Failed and OverLimit label a leg that released, one that
	// failed, and one not sent for the legs in flight.
	Done, Failed, OverLimit string
	// Read says how a leg that answered released ("the decode engine read
	// it for a request that ended before its decode did").
	Read string
}

// DecodeLegs is the kind of --release-kv-on-cancel's legs.
var DecodeLegs = Kind{
	What: "prefiller KV", Holder: "the prefiller",
	Done: metrics.KVReleaseDecodeLeg, Failed: metrics.KVReleaseFailed, OverLimit: metrics.KVReleaseOverLimit,
	Read: "the decode engine read it for a request that ended before its decode did",
}

// PinLegs is the kind of the legs that free the decode engine's pinned
// multi-turn histories no turn will read.
var PinLegs = Kind{
	What: "decode engine's pinned history", Holder: "the decode engine (decoder_kv_blocks_ttl)",
	Done: metrics.PinReleaseSent, Failed: metrics.PinReleaseFailed, OverLimit: metrics.PinReleaseOverLimit,
	Read: "a prefill engine was given it to read and frees it",
}

// Releaser sends the release legs of a proxy, in the background: at most
// a few at once, each within a bound, all cancelled when Run ends. Safe
// for concurrent use.
type Releaser struct {
	conn   connectors.KVReleaser
	kind   Kind
	tr     *upstream.Transport
	counts *prometheus.CounterVec
	sem    chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex // orders go with the end of Run
	wg     sync.WaitGroup
	done   bool // stopped: nothing more is sent
}

// New returns a releaser of kind's legs, whose bodies conn builds (nil:
// the caller's), sent through tr and counted in counts (by kind's labels).
func New(kind Kind, conn connectors.KVReleaser, tr *upstream.Transport, counts *prometheus.CounterVec) *Releaser {
	ctx, cancel := context.WithCancel(context.Background())
	return &Releaser{
		conn: conn, kind: kind, tr: tr, counts: counts,
		sem: make(chan struct{}, maxInFlight), ctx: ctx, cancel: cancel,
	}
}

// Run returns once ctx is done and the release legs then in flight, which
// it cancels, have ended; from then on no release leg is sent. The legs
// are started by Release, from New on.
func (kr *Releaser) Run(ctx context.Context) {
	<-ctx.Done()
	kr.mu.Lock()
	kr.done = true
	kr.mu.Unlock()
	kr.cancel()
	kr.wg.Wait()
}

// Release sends a release leg to the engine at addr in the background,
// logging to lg. Once a place among those in flight is free,
// leg builds the leg's request, head and body, from the releaser's
// connector (its ReleaseBody); an error there means there is no release
// leg for this request. Past the legs in flight, or once Run has ended,
// nothing is sent.
func (kr *Releaser) Release(addr string, lg zerolog.Logger, leg func(conn connectors.KVReleaser) ([]byte, error)) {
	select {
	case kr.sem <- struct{}{}:
	default:
		kr.counts.WithLabelValues(kr.kind.OverLimit).Inc()
		lg.Info().Int("limit", maxInFlight).Msgf("%s not released: too many release legs in flight; it is freed by %s's own timeout", kr.kind.What, kr.kind.Holder)
		return
	}
	raw, err := leg(kr.conn)
	if err != nil {
		<-kr.sem
		kr.counts.WithLabelValues(kr.kind.Failed).Inc()
		lg.Info().Err(err).Msgf("%s not released: no release leg for this body", kr.kind.What)
		return
	}
	kr.mu.Lock()
	defer kr.mu.Unlock()
	if kr.done {
		<-kr.sem
		return
	}
	kr.wg.Add(1)
	go kr.send(addr, raw, lg)
}

// send sends the release leg raw (a whole HTTP request) to addr, reads its
// answer and discards it, and counts how it went.
func (kr *Releaser) send(addr string, raw []byte, lg zerolog.Logger) {
	defer kr.wg.Done()
	defer func() { <-kr.sem }()
	start := time.Now()
	status, err := kr.exchange(addr, raw)
	if err == nil && status != fasthttp.StatusOK {
		err = fmt.Errorf("%w: the engine answered %d", upstream.ErrBadUpstreamAnswer, status)
	}
	if err != nil {
		kr.counts.WithLabelValues(kr.kind.Failed).Inc()
		lg.Info().Err(err).Dur("took", time.Since(start)).Msgf("%s release failed; it is freed by %s's own timeout", kr.kind.What, kr.kind.Holder)
		return
	}
	kr.counts.WithLabelValues(kr.kind.Done).Inc()
	lg.Info().Dur("took", time.Since(start)).Msgf("%s released: %s", kr.kind.What, kr.kind.Read)
}

// exchange runs the release leg and returns its answer's status.
func (kr *Releaser) exchange(addr string, raw []byte) (int, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := req.Read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
		return 0, fmt.Errorf("release leg: %w", err)
	}
	ctx, cancel := context.WithTimeout(kr.ctx, timeout)
	defer cancel()
	hold, err := kr.tr.Do(ctx, addr, req, resp)
	hold.Release() // the answer is discarded
	if err != nil {
		return 0, fmt.Errorf("release leg: %w", err)
	}
	return resp.StatusCode(), nil
}
