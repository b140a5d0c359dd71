// Package prewarm warms up the prefillers the sidecar sees for the first
// time (--prefill-prewarm). The first KV transfer between the local decode
// engine and a prefiller it never pulled from pays a handshake: vLLM's
// NIXL agent fetches the prefiller's agent metadata and connects to it,
// seconds that land in that request's time to first token. When a
// prefiller is seen for the first time — a request names one that passed
// the allowlist, or the InferencePool watcher reports a new Ready pod —
// the sidecar sends it, in the background, one tiny warm-up split: a
// prefill of a short prompt through the sequential connector, then the
// decode leg with its kv_transfer_params (max_tokens 1, not streamed,
// answer discarded) to each local engine, which pulls the KV and so
// connects to the prefiller before a client request needs it. The request
// that revealed the prefiller does not wait: it proceeds at once and may
// share the handshake the warm-up started. Warm-ups are no client
// requests: they touch no request counter, status count, circuit breaker
// or prefiller label, only pd_sidecar_prewarms_total.
package prewarm

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/logvalue"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The warm-ups' bounds. Prefiller addresses come from a header, so the
// set of those seen is bounded (the oldest forgotten first: a forgotten
// one seen again is warmed again, which costs one tiny split), as are the
// warm-ups waiting and those in flight, and the rate they start at.
const (
	maxSeen  = 1024
	queueLen = 64
	inFlight = 2
	perSec   = 2
	burst    = 4
	// decodeTimeout bounds a warm-up's decode leg, whose KV pull is the
	// handshake it is there to pay (seconds on NIXL).
	decodeTimeout = 60 * time.Second
	// modelRetry is the first wait between asking the local engine for
	// its model while it is not up yet (doubling to modelRetryMax).
	modelRetry    = time.Second
	modelRetryMax = 30 * time.Second
	// promptWords is the warm-up prompt's length in words: more than a KV
	// block of any usual size (16 to 128 tokens), since vLLM's NIXL
	// connector transfers full blocks only and a prompt shorter than one
	// would move no KV and make no handshake.
	promptWords = 160
	// headerRequestID is the header of a leg's request id, as on every
	// leg the sidecar sends (core.HeaderRequestID).
	headerRequestID = "X-Request-Id"
)

// Sentinel errors of a warm-up.
var (
	// ErrNoKV: the warm-up's prefill answer handed off no KV.
	ErrNoKV = errors.New("warm-up prefill ended on its first token: no KV to pull")
	// ErrStatus: a warm-up leg was answered with an error status.
	ErrStatus = errors.New("warm-up leg answered an error")
	// ErrNoModel: the local engine's GET /v1/models named no model.
	ErrNoModel = errors.New("the local engine's /v1/models names no model")
)

// Deps is what a Warmer needs of the sidecar. Every field is required.
type Deps struct {
	// Covered says why the connector's split cannot be warmed up, or ""
	// when it can. It is asked at every sighting and when Run starts.
	Covered func() string
	// Own reports whether hp is one of the sidecar's own ports: warming
	// it would send the sidecar requests of its own.
	Own func(hp string) bool
	// Seq builds the warm-up's legs and reads its prefill answer.
	Seq connectors.Sequential
	// CheckHandoff checks the handoff of prefiller hp's answer as a
	// request's is checked (the addresses it names).
	CheckHandoff func(hp string, h connectors.Handoff) error
	// TPGuard refuses a handoff the local engines cannot read
	// (--decode-tp-size).
	TPGuard func(h connectors.Handoff) error
	// Transport sends the legs.
	Transport *upstream.Transport
	// Locals are the local engines, one per data-parallel rank, rank 0's
	// first: each gets a warm-up's decode leg, rank 0 is asked the model.
	Locals []string
	// PrefillTimeout bounds a warm-up's prefill leg (--prefill-timeout);
	// ConnectTimeout, with 5 s more, a question of the model.
	PrefillTimeout, ConnectTimeout time.Duration
	// Spread is the window a fresh sighting's warm-up waits a random share
	// of before it is queued (--prefill-prewarm-spread; 0: none). A fresh
	// sighting — a new Ready pod of the InferencePool, a static allowlist
	// entry at start — reaches every sidecar of the fleet at once: spread
	// over the window, N sidecars warm the new prefiller at N/Spread a
	// second instead of all within the same ~100 ms. A prefiller a request
	// names first is warmed at once.
	Spread time.Duration
	// Count counts the warm-ups by result (pd_sidecar_prewarms_total).
	Count *prometheus.CounterVec
	// Log is the sidecar's logger.
	Log zerolog.Logger
}

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

// Sighting is what became of a sighting of a prefiller (Warmer.Saw).
type Sighting uint8

// The sightings.
const (
	Known   Sighting = iota // seen before: nothing to do
	Queued                  // a warm-up is queued
	Skipped                 // new, but no warm-up: queue full, or the sidecar's own address
)

// Warmer runs the warm-ups. The zero of its pointer (nil) is off.
type Warmer struct {
	d     Deps
	seen  *seenSet
	queue chan string
	limit *rate.Limiter
	log   zerolog.Logger
	// warm runs one warm-up (split; tests replace it).
	warm func(ctx context.Context, hp string) error
	// draw picks a fresh sighting's wait in [0, Spread), and after runs f
	// once that wait has passed (tests replace both).
	draw  func(n time.Duration) time.Duration
	after func(d time.Duration, f func())
	// waiting counts the warm-ups waiting out their spread: with those in
	// the queue, at most queueLen.
	waiting atomic.Int32

	mu    sync.Mutex
	model string // the local engine's served model name, once known
}

// New returns a Warmer on d.
func New(d Deps) *Warmer {
	w := &Warmer{
		d:     d,
		seen:  newSeenSet(maxSeen),
		queue: make(chan string, queueLen),
		limit: rate.NewLimiter(perSec, burst),
		log:   d.Log.With().Str("component", "prewarm").Logger(),
	}
	w.warm = w.split
	w.draw = rand.N[time.Duration]
	w.after = func(d time.Duration, f func()) { time.AfterFunc(d, f) }
	return w
}

// Saw records a sighting of prefiller hp (allowed, well-formed) and queues
// a warm-up of it when it is new, or fresh. It never blocks.
func (w *Warmer) Saw(hp string, fresh bool) Sighting {
	if w == nil || w.d.Covered() != "" {
		return Known
	}
	if fresh {
		w.seen.forget(hp)
	}
	if !w.seen.add(hp) {
		return Known
	}
	if w.d.Own(hp) {
		w.skipped(hp, "the sidecar's own address")
		return Skipped
	}
	if fresh && w.d.Spread > 0 {
		if int(w.waiting.Add(1))+len(w.queue) > queueLen {
			w.waiting.Add(-1)
			w.full(hp)
			return Skipped
		}
		w.after(w.draw(w.d.Spread), func() {
			w.waiting.Add(-1)
			w.enqueue(hp)
		})
		return Queued
	}
	if !w.enqueue(hp) {
		return Skipped
	}
	return Queued
}

// enqueue queues a warm-up of hp, or counts it skipped when the queue is
// full.
func (w *Warmer) enqueue(hp string) bool {
	select {
	case w.queue <- hp:
		return true
	default:
		w.full(hp)
		return false
	}
}

// full skips hp for a full queue. It is forgotten again, so that a later
// sighting, once the queue has drained, warms it.
func (w *Warmer) full(hp string) {
	w.seen.forget(hp)
	w.skipped(hp, "warm-up queue full")
}

func (w *Warmer) skipped(hp, why string) {
	w.d.Count.WithLabelValues(metrics.PrewarmSkipped).Inc()
	w.log.Info().Str("prefiller", logvalue.Cut(hp)).Str("result", metrics.PrewarmSkipped).Str("reason", why).Msg("prefiller warm-up skipped")
}

// Run runs the warm-ups, a few at a time, until ctx is done, and returns
// once they have ended. With a connector whose split cannot be warmed up
// it says so and returns at once.
func (w *Warmer) Run(ctx context.Context) {
	if why := w.d.Covered(); why != "" {
		w.log.Warn().Str("reason", why).Msg("--prefill-prewarm has no effect with this connector")
		return
	}
	var wg sync.WaitGroup
	for range inFlight {
		wg.Go(func() { w.worker(ctx) })
	}
	wg.Wait()
}

func (w *Warmer) worker(ctx context.Context) {
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
		w.d.Count.WithLabelValues(result).Inc()
		w.log.WithLevel(level).Err(err).Str("prefiller", logvalue.Cut(hp)).Str("result", result).
			Dur("duration", time.Since(start)).Msg("prefiller warm-up")
	}
}

// split is one warm-up of prefiller hp: for each local engine (one per
// data-parallel rank, each with a NIXL agent of its own), a prefill on hp
// and the decode leg of its handoff.
func (w *Warmer) split(ctx context.Context, hp string) error {
	model, err := w.modelName(ctx)
	if err != nil {
		return err
	}
	for _, local := range w.d.Locals {
		if err := w.splitTo(ctx, hp, local, model); err != nil {
			return err
		}
	}
	return nil
}

func (w *Warmer) splitTo(ctx context.Context, hp, local, model string) error {
	d := &w.d
	id := "pd-sidecar-prewarm-" + randomHex()
	// A prompt of its own each time: a decoder holding the prompt in its
	// prefix cache would pull nothing, and so not connect.
	client := clientBody(model, id)
	body, err := d.Seq.PrefillBody(nil, connectors.APICompletions, client)
	if err != nil {
		return fmt.Errorf("warm-up prefill body: %w", err)
	}
	pctx, cancel := context.WithTimeoutCause(ctx, d.PrefillTimeout, split.ErrPrefillTimeout)
	status, answer, err := w.exchange(pctx, hp, id, body)
	cancel()
	if err != nil {
		return fmt.Errorf("warm-up prefill on %s: %w", logvalue.Cut(hp), err)
	}
	if status != fasthttp.StatusOK {
		return fmt.Errorf("%w: prefill on %s: status %d", ErrStatus, logvalue.Cut(hp), status)
	}
	h, err := d.Seq.ParsePrefill(connectors.APICompletions, answer)
	if err == nil {
		err = d.CheckHandoff(hp, h)
	}
	if err != nil {
		return fmt.Errorf("warm-up prefill on %s: %w", logvalue.Cut(hp), err)
	}
	if h.Done {
		return ErrNoKV
	}
	if err := d.TPGuard(h); err != nil {
		return err
	}
	body, err = d.Seq.DecodeBody(nil, connectors.APICompletions, client, h)
	if err != nil {
		return fmt.Errorf("warm-up decode body: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, decodeTimeout)
	defer cancel()
	status, _, err = w.exchange(dctx, local, id, body)
	if err != nil {
		return fmt.Errorf("warm-up decode on %s: %w", local, err)
	}
	if status != fasthttp.StatusOK {
		return fmt.Errorf("%w: decode on %s: status %d", ErrStatus, local, status)
	}
	return nil
}

// exchange POSTs body to /v1/completions on addr and returns the answer's
// status and a copy of its body.
func (w *Warmer) exchange(ctx context.Context, addr, id string, body []byte) (int, []byte, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(connectors.APICompletions.String())
	req.Header.SetHost(addr)
	req.Header.SetContentType("application/json")
	req.Header.Set(headerRequestID, id)
	req.SetBodyRaw(body)
	hold, err := w.d.Transport.Do(ctx, addr, req, resp)
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
func (w *Warmer) modelName(ctx context.Context) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock() // one asker at a time; the others wait for its answer
	if w.model != "" {
		return w.model, nil
	}
	wait := modelRetry
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
		wait = min(2*wait, modelRetryMax)
	}
}

// askModel asks the local engine once; retry reports a failure that may
// pass (the engine not up yet).
func (w *Warmer) askModel(ctx context.Context) (model string, retry bool, err error) {
	local := w.d.Locals[0]
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.SetRequestURI("/v1/models")
	req.Header.SetHost(local)
	ctx, cancel := context.WithTimeout(ctx, w.d.ConnectTimeout+5*time.Second)
	defer cancel()
	hold, err := w.d.Transport.Do(ctx, local, req, resp)
	defer hold.Release()
	switch {
	case err != nil:
		return "", true, fmt.Errorf("GET /v1/models on %s: %w", local, err)
	case resp.StatusCode() >= 500:
		return "", true, fmt.Errorf("%w: GET /v1/models on %s: status %d", ErrStatus, local, resp.StatusCode())
	case resp.StatusCode() != fasthttp.StatusOK:
		return "", false, fmt.Errorf("%w: GET /v1/models on %s: status %d", ErrStatus, local, resp.StatusCode())
	}
	id := gjson.GetBytes(resp.Body(), "data.0.id").String()
	if id == "" {
		return "", false, fmt.Errorf("%w (%s)", ErrNoModel, local)
	}
	return id, false, nil
}

// clientBody is the warm-up's client body: a completion of one token for
// model, its prompt led by id (unique) and long enough to fill a few KV
// blocks.
func clientBody(model, id string) []byte {
	var b strings.Builder
	b.WriteString(`{"model":`)
	b.Write(jsonString(model))
	b.WriteString(`,"prompt":`)
	prompt := "pd-sidecar warm-up " + id + ":" + strings.Repeat(" warm", promptWords)
	b.Write(jsonString(prompt))
	b.WriteString(`,"max_tokens":1,"stream":false}`)
	return []byte(b.String())
}

// jsonString is s as a JSON string literal.
func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

// randomHex is 64 random bits in hex.
func randomHex() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return hex.EncodeToString(b[:])
}
