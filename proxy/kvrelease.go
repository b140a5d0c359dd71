package proxy

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
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Freeing the prefiller's KV when the client leaves (--release-kv-on-cancel).
//
// After a successful nixlv2 prefill the prefill engine holds the prompt's
// blocks until a decoder reads them; vLLM frees them otherwise only after
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s). A client that leaves between the
// prefill answer and the decode leg's first output (or before the decode
// leg is sent) would pin them that long. So a request remembers the handoff
// from the moment its prefill answer is parsed (awaitKVRead) until its
// decode leg's first output or KV load failure (kvHandoffDone); a request
// that ends with it still pending has a minimal decode leg sent for it in
// the background: the decode body capped at one token, not streamed, its
// answer read and discarded. The decode engine reads the blocks and the
// prefill engine frees them at once.

const (
	// maxKVReleases bounds the release legs in flight; past it a release
	// is not sent (counted over_limit), so that a wave of leaving clients
	// cannot load the decode engine with more than this many extra decodes.
	maxKVReleases = 16
	// kvReleaseTimeout bounds one release leg, from connect to the end of
	// its answer: the KV pull and one decode step on a loaded engine.
	kvReleaseTimeout = 30 * time.Second
	// kvReleaseIDSuffix marks the release leg's X-Request-Id: the client's
	// own decode leg may still be aborting on the engine under its id.
	kvReleaseIDSuffix = "-kv-release"
)

// kvReleaser sends the release legs of a proxy, in the background: at most
// maxKVReleases at once, each within kvReleaseTimeout, all cancelled when
// the proxy stops.
type kvReleaser struct {
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

// newKVReleaser returns the releaser of p, or nil when releases are off or
// its connector's prefiller pins nothing for a decoder that never comes
// (only a KVReleaser's decoder pulls; MoRI-IO write mode pushes the KV
// into the decoder from the prefiller).
func newKVReleaser(p *Proxy) *kvReleaser {
	c, ok := p.conn.(connectors.KVReleaser)
	if !p.cfg.ReleaseKVOnCancel || !ok || p.seq == nil || p.mori != nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &kvReleaser{
		conn: c, tr: p.tr, counts: p.m.KVReleases,
		sem: make(chan struct{}, maxKVReleases), ctx: ctx, cancel: cancel,
	}
}

// Run returns once ctx is done and the release legs then in flight, which
// it cancels, have ended; from then on no release leg is sent. The legs
// are started by the requests that end with a handoff unread, from New on.
func (kr *kvReleaser) Run(ctx context.Context) {
	<-ctx.Done()
	kr.mu.Lock()
	kr.done = true
	kr.mu.Unlock()
	kr.cancel()
	kr.wg.Wait()
}

// awaitKVRead records the handoff of a parsed prefill answer as pending a
// read by the decode engine (nothing when releases are off, or the answer
// has nothing to read: an error, or generation ended on the first token).
func (r *request) awaitKVRead(h connectors.Handoff, err error) {
	if r.p.kvr == nil || err != nil || h.Done || h.Params == nil {
		return
	}
	r.kvPending = &h
}

// releaseKV sends the release leg of a request that ends with its handoff
// still pending a read (see awaitKVRead), once. start is the start of the
// request's legs' head (appendLegStart; nil: built from the client's head
// on fasthttp's path). The leg's request is built here, as a copy, before
// the request's buffers are given back; only its sending is left to the
// background.
func (r *request) releaseKV(start []byte) {
	h, kr := r.kvPending, r.p.kvr
	r.kvPending = nil
	if h == nil || kr == nil {
		return
	}
	if r.p.tpGuard(*h) != nil {
		return // a handoff the decode engine is not to read
	}
	if start == nil {
		if r.rc == nil {
			return
		}
		target := clientconn.OriginForm(r.rc) // the path routed on
		if target == nil {
			target = r.rc.Request.Header.RequestURI()
		}
		start = appendLegStartAt(nil, &r.rc.Request.Header, target, nil)
	} else {
		start = append([]byte(nil), start...)
	}
	lg := r.logger().With().Str("kv_release", "decode_leg").Logger()
	select {
	case kr.sem <- struct{}{}:
	default:
		kr.counts.WithLabelValues(metrics.KVReleaseOverLimit).Inc()
		lg.Info().Int("limit", maxKVReleases).Msg("prefiller KV not released: too many release legs in flight; it is freed by the prefiller's own timeout")
		return
	}
	body, err := kr.conn.ReleaseBody(nil, r.api, r.body, *h)
	if err != nil {
		<-kr.sem
		kr.counts.WithLabelValues(metrics.KVReleaseFailed).Inc()
		lg.Info().Err(err).Msg("prefiller KV not released: no release leg for this body")
		return
	}
	raw := appendLegEnd(start, r.local, r.id+kvReleaseIDSuffix, len(body))
	raw = append(raw, body...)
	kr.mu.Lock()
	defer kr.mu.Unlock()
	if kr.done {
		<-kr.sem
		return
	}
	kr.wg.Add(1)
	go kr.send(r.local, raw, lg)
}

// send sends the release leg raw (a whole HTTP request) to addr, reads its
// answer and discards it, and counts how it went.
func (kr *kvReleaser) send(addr string, raw []byte, lg zerolog.Logger) {
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
func (kr *kvReleaser) exchange(addr string, raw []byte) (int, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := req.Read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
		return 0, fmt.Errorf("release leg: %w", err)
	}
	ctx, cancel := context.WithTimeout(kr.ctx, kvReleaseTimeout)
	defer cancel()
	hold, err := kr.tr.Do(ctx, addr, req, resp)
	hold.Release() // the answer is discarded
	if err != nil {
		return 0, fmt.Errorf("release leg: %w", err)
	}
	return resp.StatusCode(), nil
}

// releaseKV is request.releaseKV for the lane's request, whose legs' head
// start is the split's (the loop's parsed head is another request's by
// now).
func (lc *laneConn) releaseKV() {
	if r := lc.r; r != nil && r.kvPending != nil && lc.pd != nil {
		r.releaseKV(lc.pd.start)
	}
}

var _ background = (*kvReleaser)(nil)
