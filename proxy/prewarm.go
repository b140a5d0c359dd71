package proxy

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// Pre-warmed prefillers (--prefill-prewarm). The first KV transfer between
// the local decode engine and a prefiller it never pulled from pays a
// handshake: vLLM's NIXL agent fetches the prefiller's agent metadata and
// connects to it, seconds that land in that request's time to first token.
// When a prefiller is seen for the first time — a request names one that
// passed the allowlist, or the InferencePool watcher reports a new Ready
// pod — the sidecar sends it, in the background, one tiny warm-up split: a
// prefill of a short prompt through the sequential connector, then the
// decode leg with its kv_transfer_params (max_tokens 1, not streamed,
// answer discarded) to each local engine, which pulls the KV and so
// connects to the prefiller before a client request needs it. The request
// that revealed the prefiller does not wait: it proceeds at once and may
// share the handshake the warm-up started. Warm-ups are no client
// requests: they touch no request counter, status count, circuit breaker
// or prefiller label, only pd_sidecar_prewarms_total.

// The warm-ups' bounds. Prefiller addresses come from a header, so the
// set of those seen is bounded (the oldest forgotten first: a forgotten
// one seen again is warmed again, which costs one tiny split), as are the
// warm-ups waiting and those in flight, and the rate they start at.
const (
	prewarmSeen     = 1024
	prewarmQueue    = 64
	prewarmInFlight = 2
	prewarmPerSec   = 2
	prewarmBurst    = 4
	// prewarmDecodeTimeout bounds a warm-up's decode leg, whose KV pull is
	// the handshake it is there to pay (seconds on NIXL).
	prewarmDecodeTimeout = 60 * time.Second
	// prewarmModelRetry is the first wait between asking the local engine
	// for its model while it is not up yet (doubling to prewarmModelRetryMax).
	prewarmModelRetry    = time.Second
	prewarmModelRetryMax = 30 * time.Second
	// prewarmPromptWords is the warm-up prompt's length in words: more
	// than a KV block of any usual size (16 to 128 tokens), since vLLM's
	// NIXL connector transfers full blocks only and a prompt shorter than
	// one would move no KV and make no handshake.
	prewarmPromptWords = 160
)

// seenSet is a bounded set of prefiller addresses: past max members the
// oldest added is forgotten (FIFO, so that a lookup, the common case on the
// request path, takes only a read lock). Safe for concurrent use.
type seenSet struct {
	mu    sync.RWMutex
	max   int
	set   map[string]struct{}
	order []string // ring of members by age; next is the oldest when full
	next  int
}

func newSeenSet(max int) *seenSet {
	return &seenSet{max: max, set: make(map[string]struct{}, max)}
}

// add adds v and reports whether it was new.
func (s *seenSet) add(v string) bool {
	s.mu.RLock()
	_, ok := s.set[v]
	s.mu.RUnlock()
	if ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.set[v]; ok {
		return false
	}
	if len(s.order) < s.max {
		s.order = append(s.order, v)
	} else {
		delete(s.set, s.order[s.next])
		s.order[s.next] = v
		s.next = (s.next + 1) % s.max
	}
	s.set[v] = struct{}{}
	return true
}

// forget removes v (its ring slot is reused when it comes up as the
// oldest: then there is nothing left to delete).
func (s *seenSet) forget(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.set, v)
}

// len is the number of members.
func (s *seenSet) len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.set)
}

// What became of a sighting of a prefiller (prewarmer.saw).
type sighting uint8

const (
	sightKnown   sighting = iota // seen before: nothing to do
	sightQueued                  // a warm-up is queued
	sightSkipped                 // new, but no warm-up: queue full, or the sidecar's own address
)

// prewarmer runs the warm-ups. The zero of its pointer (nil) is off.
type prewarmer struct {
	p     *Proxy
	seen  *seenSet
	queue chan string
	limit *rate.Limiter
	count *prometheus.CounterVec
	log   zerolog.Logger
	// warm runs one warm-up (the proxy's split; tests replace it).
	warm func(ctx context.Context, hp string) error

	mu    sync.Mutex
	model string // the local engine's served model name, once known
}

func newPrewarmer(p *Proxy) *prewarmer {
	w := &prewarmer{
		p:     p,
		seen:  newSeenSet(prewarmSeen),
		queue: make(chan string, prewarmQueue),
		limit: rate.NewLimiter(prewarmPerSec, prewarmBurst),
		count: p.m.Prewarms,
		log:   p.log.With().Str("component", "prewarm").Logger(),
	}
	w.warm = w.split
	return w
}

// prewarmCovered reports why the connector's split cannot be warmed up,
// or "" when it can: only a sequential split whose decode leg hands the
// local engine the prefill's kv_transfer_params and lets it pull the KV
// (nixlv2) has an engine-to-engine handshake to pay ahead. The concurrent
// connectors (sglang, mooncake, offloading) are not built for it, the
// decode-first one (shared-storage) moves KV through storage, the sidecar's
// own pull (--kv-connector sidecar) is not the engine's, and MoRI-IO write
// mode's prefiller writes into the decoder with per-request fields.
func (p *Proxy) prewarmCovered() string {
	switch {
	case p.seq == nil || p.choreo != connectors.ChoreographySequential:
		return "the connector's split is not a prefill then a decode" // a constant: asked on every request
	case p.kv != nil:
		return "the sidecar pulls the KV itself"
	case p.mori != nil:
		return "MoRI-IO write mode"
	}
	return ""
}

// NotePrefiller tells the proxy that hostport (host:port) is a prefiller
// now (the InferencePool watcher's new Ready pod): with --prefill-prewarm
// it is warmed up, even when seen before (a pod that came back is a new
// engine, with no connection to the local one). It never blocks.
func (p *Proxy) NotePrefiller(hostport string) {
	p.warm.saw(hostport, true)
}

// saw records a sighting of prefiller hp (allowed, well-formed) and queues
// a warm-up of it when it is new, or fresh. It never blocks.
func (w *prewarmer) saw(hp string, fresh bool) sighting {
	if w == nil || w.p.prewarmCovered() != "" {
		return sightKnown
	}
	if fresh {
		w.seen.forget(hp)
	}
	if !w.seen.add(hp) {
		return sightKnown
	}
	if w.p.ownAddr(hp) {
		w.skipped(hp, "the sidecar's own address")
		return sightSkipped
	}
	select {
	case w.queue <- hp:
		return sightQueued
	default:
		// Forgotten again, so that a later sighting, once the queue has
		// drained, warms it.
		w.seen.forget(hp)
		w.skipped(hp, "warm-up queue full")
		return sightSkipped
	}
}

func (w *prewarmer) skipped(hp, why string) {
	w.count.WithLabelValues(metrics.PrewarmSkipped).Inc()
	w.log.Info().Str("prefiller", logValue(hp)).Str("result", metrics.PrewarmSkipped).Str("reason", why).Msg("prefiller warm-up skipped")
}

// ownAddr reports whether hp is one of the sidecar's own ports: warming
// it would send the sidecar requests of its own.
func (p *Proxy) ownAddr(hp string) bool {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < p.cfg.Port || n >= p.cfg.Port+p.cfg.DataParallelSize {
		return false
	}
	if host == p.cfg.PodIP || host == p.cfg.Host || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// Run runs the warm-ups, prewarmInFlight at a time, until ctx is done, and
// returns once they have ended. With a connector whose split cannot be
// warmed up it says so and returns at once.
func (w *prewarmer) Run(ctx context.Context) {
	if why := w.p.prewarmCovered(); why != "" {
		w.log.Warn().Str("reason", why).Msg("--prefill-prewarm has no effect with this connector")
		return
	}
	var wg sync.WaitGroup
	for range prewarmInFlight {
		wg.Go(func() { w.worker(ctx) })
	}
	wg.Wait()
}

func (w *prewarmer) worker(ctx context.Context) {
	for {
		var hp string
		select {
		case <-ctx.Done():
			return
		case hp = <-w.queue:
		}
		if w.limit.Wait(ctx) != nil {
			return
		}
		start := time.Now()
		err := w.warm(ctx, hp)
		if ctx.Err() != nil {
			return // stopping: neither ok nor the prefiller's failure
		}
		result, level := metrics.PrewarmOK, zerolog.InfoLevel
		if err != nil {
			result, level = metrics.PrewarmFailed, zerolog.WarnLevel
		}
		w.count.WithLabelValues(result).Inc()
		w.log.WithLevel(level).Err(err).Str("prefiller", logValue(hp)).Str("result", result).
			Dur("duration", time.Since(start)).Msg("prefiller warm-up")
	}
}

// Sentinel errors of a warm-up.
var (
	// ErrPrewarmNoKV: the warm-up's prefill answer handed off no KV.
	ErrPrewarmNoKV = errors.New("warm-up prefill ended on its first token: no KV to pull")
	// ErrPrewarmStatus: a warm-up leg was answered with an error status.
	ErrPrewarmStatus = errors.New("warm-up leg answered an error")
	// ErrNoModel: the local engine's GET /v1/models named no model.
	ErrNoModel = errors.New("the local engine's /v1/models names no model")
)

// split is one warm-up of prefiller hp: for each local engine (one per
// data-parallel rank, each with a NIXL agent of its own), a prefill on hp
// and the decode leg of its handoff.
func (w *prewarmer) split(ctx context.Context, hp string) error {
	model, err := w.modelName(ctx)
	if err != nil {
		return err
	}
	for rank := range w.p.cfg.DataParallelSize {
		if err := w.splitTo(ctx, hp, w.p.localAddr(rank), model); err != nil {
			return err
		}
	}
	return nil
}

func (w *prewarmer) splitTo(ctx context.Context, hp, local, model string) error {
	p := w.p
	id := "pd-sidecar-prewarm-" + randomHex()
	// A prompt of its own each time: a decoder holding the prompt in its
	// prefix cache would pull nothing, and so not connect.
	client := prewarmBody(model, id)
	body, err := p.seq.PrefillBody(nil, connectors.APICompletions, client)
	if err != nil {
		return fmt.Errorf("warm-up prefill body: %w", err)
	}
	pctx, cancel := context.WithTimeoutCause(ctx, p.cfg.PrefillTimeout, ErrPrefillTimeout)
	status, answer, err := w.exchange(pctx, hp, id, body)
	cancel()
	if err != nil {
		return fmt.Errorf("warm-up prefill on %s: %w", logValue(hp), err)
	}
	if status != fasthttp.StatusOK {
		return fmt.Errorf("%w: prefill on %s: status %d", ErrPrewarmStatus, logValue(hp), status)
	}
	h, err := p.seq.ParsePrefill(connectors.APICompletions, answer)
	if err == nil {
		err = p.checkHandoff(hp, h) // answeraddrs.go
	}
	if err != nil {
		return fmt.Errorf("warm-up prefill on %s: %w", logValue(hp), err)
	}
	if h.Done {
		return ErrPrewarmNoKV
	}
	if err := p.tpGuard(h); err != nil {
		return err
	}
	body, err = p.seq.DecodeBody(nil, connectors.APICompletions, client, h)
	if err != nil {
		return fmt.Errorf("warm-up decode body: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, prewarmDecodeTimeout)
	defer cancel()
	status, _, err = w.exchange(dctx, local, id, body)
	if err != nil {
		return fmt.Errorf("warm-up decode on %s: %w", local, err)
	}
	if status != fasthttp.StatusOK {
		return fmt.Errorf("%w: decode on %s: status %d", ErrPrewarmStatus, local, status)
	}
	return nil
}

// exchange POSTs body to /v1/completions on addr and returns the answer's
// status and a copy of its body.
func (w *prewarmer) exchange(ctx context.Context, addr, id string, body []byte) (int, []byte, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(connectors.APICompletions.String())
	req.Header.SetHost(addr)
	req.Header.SetContentType("application/json")
	req.Header.Set(HeaderRequestID, id)
	req.SetBodyRaw(body)
	hold, err := w.p.tr.Do(ctx, addr, req, resp)
	defer hold.Release()
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

// modelName is the served model name of the local engine (rank 0), from
// its GET /v1/models (the first model listed: vLLM lists the base model
// before any LoRA adapter), asked once and kept. While the engine is not
// up (no answer, or a 5xx) it waits and asks again, so that warm-ups of
// the prefillers seen while the engine loads run once it serves.
func (w *prewarmer) modelName(ctx context.Context) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock() // one asker at a time; the others wait for its answer
	if w.model != "" {
		return w.model, nil
	}
	wait := prewarmModelRetry
	for {
		model, retry, err := w.askModel(ctx)
		if err == nil {
			w.model = model
			w.log.Info().Str("model", model).Msg("warm-ups use the local engine's model")
			return model, nil
		}
		if !retry {
			return "", err
		}
		w.log.Info().Err(err).Dur("retry_in", wait).Msg("local engine not serving yet: warm-ups wait")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", context.Cause(ctx)
		case <-t.C:
		}
		wait = min(2*wait, prewarmModelRetryMax)
	}
}

// askModel asks the local engine once; retry reports a failure that may
// pass (the engine not up yet).
func (w *prewarmer) askModel(ctx context.Context) (model string, retry bool, err error) {
	p := w.p
	local := p.localAddr(0)
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.SetRequestURI("/v1/models")
	req.Header.SetHost(local)
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConnectTimeout+5*time.Second)
	defer cancel()
	hold, err := p.tr.Do(ctx, local, req, resp)
	defer hold.Release()
	switch {
	case err != nil:
		return "", true, fmt.Errorf("GET /v1/models on %s: %w", local, err)
	case resp.StatusCode() >= 500:
		return "", true, fmt.Errorf("%w: GET /v1/models on %s: status %d", ErrPrewarmStatus, local, resp.StatusCode())
	case resp.StatusCode() != fasthttp.StatusOK:
		return "", false, fmt.Errorf("%w: GET /v1/models on %s: status %d", ErrPrewarmStatus, local, resp.StatusCode())
	}
	id := gjson.GetBytes(resp.Body(), "data.0.id").String()
	if id == "" {
		return "", false, fmt.Errorf("%w (%s)", ErrNoModel, local)
	}
	return id, false, nil
}

// prewarmBody is the warm-up's client body: a completion of one token
// for model, its prompt led by id (unique) and long enough to fill a few
// KV blocks.
func prewarmBody(model, id string) []byte {
	var b strings.Builder
	b.WriteString(`{"model":`)
	b.Write(appendJSONString(nil, model))
	b.WriteString(`,"prompt":`)
	prompt := "pd-sidecar warm-up " + id + ":" + strings.Repeat(" warm", prewarmPromptWords)
	b.Write(appendJSONString(nil, prompt))
	b.WriteString(`,"max_tokens":1,"stream":false}`)
	return []byte(b.String())
}

// randomHex is 64 random bits in hex.
func randomHex() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

var _ background = (*prewarmer)(nil)
