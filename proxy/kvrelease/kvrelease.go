// Package kvrelease sends release legs (--release-kv-on-cancel): minimal
// decode legs, in the background, for requests that ended while the
// prefill engine still held their KV for a decoder that never read it, so
// that the decode engine reads the blocks and the prefill engine frees them
// at once instead of at its own timeout. Which requests need one, and what
// the leg says, are the caller's; this package bounds the legs in flight
// and the time each takes, reads and discards their answers, counts how
// they went, and stops them all at the end of Run.
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

// Releaser sends the release legs of a proxy, in the background: at most
// a few at once, each within a bound, all cancelled when Run ends. Safe
// for concurrent use.
type Releaser struct {
	conn   connectors.KVReleaser
	tr     *upstream.Transport
	counts *prometheus.CounterVec
	sem    chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex // orders go with the end of Run
	wg     sync.WaitGroup
	done   bool // stopped: nothing more is sent
}

// New returns a releaser whose legs' bodies conn builds, sent through tr
// and counted in counts (pd_sidecar_kv_releases_total, by how).
func New(conn connectors.KVReleaser, tr *upstream.Transport, counts *prometheus.CounterVec) *Releaser {
	ctx, cancel := context.WithCancel(context.Background())
	return &Releaser{
		conn: conn, tr: tr, counts: counts,
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

// Release sends a release leg to the decode engine at addr in the
// background, logging to lg. Once a place among those in flight is free,
// leg builds the leg's request, head and body, from the releaser's
// connector (its ReleaseBody); an error there means there is no release
// leg for this request. Past the legs in flight, or once Run has ended,
// nothing is sent.
func (kr *Releaser) Release(addr string, lg zerolog.Logger, leg func(conn connectors.KVReleaser) ([]byte, error)) {
	select {
	case kr.sem <- struct{}{}:
	default:
		kr.counts.WithLabelValues(metrics.KVReleaseOverLimit).Inc()
		lg.Info().Int("limit", maxInFlight).Msg("prefiller KV not released: too many release legs in flight; it is freed by the prefiller's own timeout")
		return
	}
	raw, err := leg(kr.conn)
	if err != nil {
		<-kr.sem
		kr.counts.WithLabelValues(metrics.KVReleaseFailed).Inc()
		lg.Info().Err(err).Msg("prefiller KV not released: no release leg for this body")
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
		err = fmt.Errorf("%w: the decode engine answered %d", upstream.ErrBadUpstreamAnswer, status)
	}
	if err != nil {
		kr.counts.WithLabelValues(metrics.KVReleaseFailed).Inc()
		lg.Info().Err(err).Dur("took", time.Since(start)).Msg("prefiller KV release failed; it is freed by the prefiller's own timeout")
		return
	}
	kr.counts.WithLabelValues(metrics.KVReleaseDecodeLeg).Inc()
	lg.Info().Dur("took", time.Since(start)).Msg("prefiller KV released: the decode engine read it for a request that ended before its decode did")
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
