package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/sidecar"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The sidecar-driven KV pull (--kv-connector sidecar): between the prefill
// answer and the decode leg, the proxy borrows blocks of the local engine's
// host KV region (POST /kv/alloc), pulls the prefiller's blocks into them
// with a kvtransfer.Puller, and names them in the decode leg. A failed pull
// frees the borrowed blocks (POST /kv/free) and never reaches the engine.
// The engine side of the protocol is connectors/sidecar/CONTRACT.md.

// KVPullConfig configures the sidecar-driven KV pull.
type KVPullConfig struct {
	// AllocTimeout bounds the allocation call to the local engine (default
	// 5 s). The pull itself is bounded by the Puller's deadline.
	AllocTimeout time.Duration
	// AllocLease is the lease asked for the borrowed local blocks: the
	// engine frees them by itself if the sidecar vanishes (default 30 s).
	AllocLease time.Duration
	// MaxRegions bounds the mapped engine regions (default 8).
	MaxRegions int
}

// Validate reports an invalid setting.
func (c KVPullConfig) Validate() error {
	if c.AllocTimeout < 0 || c.AllocLease < 0 || c.MaxRegions < 0 {
		return fmt.Errorf("kv pull settings must not be negative: %+v", c)
	}
	return nil
}

// kvSourcer is the connector ability the pull needs (connectors/sidecar).
type kvSourcer interface {
	KVSource(h connectors.Handoff) ([]byte, error)
	Preloaded(h connectors.Handoff, p sidecar.Preloaded) (connectors.Handoff, error)
}

// kvPull is the proxy's pull machinery, nil unless EnableKVPull was called.
type kvPull struct {
	cfg    KVPullConfig
	conn   kvSourcer
	puller *kvtransfer.Puller
	m      *metrics.KVPull

	// local registers cached mappings with the transport once, when it
	// can (nixl: a memory registration per read otherwise); nil if not.
	local localRegistrar

	mu      sync.Mutex
	regions map[string]*mappedRegion
	recent  map[string]string // agent address -> prefiller label, for probes
}

// localRegistrar is a transport that registers a destination region once
// for every later read into it (nixl's RegisterLocal), and undoes it
// before the region is unmapped.
type localRegistrar interface {
	RegisterLocal(r *kvtransfer.Region) error
	DeregisterLocal(r *kvtransfer.Region) error
}

// mappedRegion is a cached mapping of a local engine's KV region and the
// number of pulls writing into it now; it is unmapped only when none is.
type mappedRegion struct {
	reg        *kvtransfer.Region
	refs       int
	cached     bool // false once evicted: the last user unmaps it
	registered bool // with the transport (kvPull.local)
}

// EnableKVPull makes the proxy pull the KV itself between prefill and
// decode. The connector must have the sidecar-pull ability. Call it before
// Run.
func (p *Proxy) EnableKVPull(cfg KVPullConfig, puller *kvtransfer.Puller, m *metrics.KVPull) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	src, ok := p.conn.(kvSourcer)
	if !ok {
		return fmt.Errorf("connector %q cannot hand off a kv source for the sidecar to pull", p.conn.Name())
	}
	if cfg.AllocTimeout == 0 {
		cfg.AllocTimeout = 5 * time.Second
	}
	if cfg.AllocLease == 0 {
		cfg.AllocLease = 30 * time.Second
	}
	if cfg.MaxRegions == 0 {
		cfg.MaxRegions = 8
	}
	p.kv = &kvPull{cfg: cfg, conn: src, puller: puller, m: m,
		regions: map[string]*mappedRegion{}, recent: map[string]string{}}
	p.kv.local, _ = puller.Transport().(localRegistrar)
	return nil
}

// allocAnswer is the local engine's answer to POST /kv/alloc.
type allocAnswer struct {
	AllocID  string `json:"alloc_id"`
	BlockIDs []int  `json:"block_ids"`
	Region   struct {
		Kind       kvtransfer.Kind `json:"kind"`
		Path       string          `json:"path"`
		BlockBytes int             `json:"block_bytes"`
	} `json:"region"`
}

// errKVAlloc: the local engine did not lend blocks.
var errKVAlloc = errors.New("local engine did not lend kv blocks")

// pullKV pulls the handoff's KV into blocks borrowed from the local engine
// and returns the decode leg's handoff naming them. On error nothing is
// borrowed any more and the remote hold was released (unless its agent is
// gone).
func (r *request) pullKV(h connectors.Handoff) (connectors.Handoff, error) {
	k := r.p.kv
	// The agent is dialed below: its address is checked here too, whatever
	// read the handoff (answeraddrs.go; prefillAnswered did already).
	if err := r.p.checkHandoff(r.prefiller, h); err != nil {
		return h, err
	}
	raw, err := k.conn.KVSource(h)
	var src kvtransfer.Source
	if err == nil {
		if err = json.Unmarshal(raw, &src); err == nil {
			err = src.Validate()
		}
	}
	if err != nil {
		return h, fmt.Errorf("%w: kv_source: %w", connectors.ErrInvalidKVParams, err)
	}
	tr := k.puller.Transport().Name()
	start := time.Now()
	a, err := r.allocKV(src)
	if err == nil {
		var dst [][]byte
		var done func()
		if dst, done, err = k.destination(a, src); err == nil {
			_, err = k.puller.Pull(r.ctx, src, dst)
			done()
		}
		if err != nil {
			r.freeKV(a.AllocID)
		}
	} else {
		_ = k.puller.Release(context.Background(), src)
	}
	if err != nil {
		k.m.Failures.WithLabelValues(r.label, kvFailureReason(err)).Inc()
		return h, err
	}
	k.m.Duration.WithLabelValues(r.label, tr).Observe(time.Since(start).Seconds())
	k.m.Bytes.WithLabelValues(r.label, tr).Add(float64(src.Bytes()))
	k.remember(src.Agent, r.label)
	r.logAt(zerolog.DebugLevel).Str("transport", tr).Int("blocks", len(src.BlockIDs)).Int64("bytes", src.Bytes()).
		Dur("took", time.Since(start)).Msg("kv pulled into local blocks")
	return k.conn.Preloaded(h, sidecar.Preloaded{AllocID: a.AllocID, BlockIDs: a.BlockIDs, NumTokens: src.NumTokens})
}

// allocKV borrows len(src.BlockIDs) blocks of the local engine's region.
func (r *request) allocKV(src kvtransfer.Source) (allocAnswer, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.p.kv.cfg.AllocTimeout)
	defer cancel()
	body, _ := json.Marshal(map[string]any{
		"request_id": r.id, "num_blocks": len(src.BlockIDs), "lease_ms": r.p.kv.cfg.AllocLease.Milliseconds(),
	})
	var a allocAnswer
	b, status, err := r.engineCall(ctx, "/kv/alloc", body)
	switch {
	case err != nil:
		return a, fmt.Errorf("%w: %w", errKVAlloc, upstreamErr(upstream.RoleEngine, r.local, err))
	case status != fasthttp.StatusOK: // its body is never said
		return a, fmt.Errorf("%w: %w", errKVAlloc, &upstream.UpstreamError{Role: upstream.RoleEngine, Reason: fmt.Sprintf("answered %d", status), Addr: r.local})
	}
	if err := json.Unmarshal(b, &a); err != nil || a.AllocID == "" || len(a.BlockIDs) != len(src.BlockIDs) {
		return a, fmt.Errorf("%w: %w", errKVAlloc, &upstream.UpstreamError{Role: upstream.RoleEngine, Reason: "unusable answer", Addr: r.local, Err: err})
	}
	return a, nil
}

// freeKV returns borrowed blocks, best effort (the allocation's lease
// covers a failure here).
func (r *request) freeKV(allocID string) {
	ctx, cancel := context.WithTimeout(context.Background(), r.p.cfg.ConnectTimeout+time.Second)
	defer cancel()
	body, _ := json.Marshal(map[string]string{"alloc_id": allocID})
	if _, status, err := r.engineCall(ctx, "/kv/free", body); err != nil || status >= 300 {
		r.logAt(zerolog.WarnLevel).Err(err).Int("status", status).Str("alloc_id", allocID).Msg("could not free borrowed kv blocks; their lease will")
	}
}

// engineCall POSTs a JSON body to the local engine.
func (r *request) engineCall(ctx context.Context, path string, body []byte) ([]byte, int, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(path)
	req.Header.SetHost(r.local)
	req.Header.SetContentType("application/json")
	req.Header.Set(HeaderRequestID, r.id)
	req.SetBodyRaw(body)
	hold, err := r.p.tr.Do(ctx, r.local, req, resp)
	defer hold.Release() // resp is let go on return; the copy returned is small JSON
	if err != nil {
		return nil, 0, err
	}
	return append([]byte(nil), resp.Body()...), resp.StatusCode(), nil
}

// destination maps the engine's region (cached) and returns the borrowed
// blocks' bytes, and done, to call once the pull no longer writes them.
func (k *kvPull) destination(a allocAnswer, src kvtransfer.Source) ([][]byte, func(), error) {
	if a.Region.Kind != kvtransfer.KindHost {
		return nil, nil, fmt.Errorf("local region of kind %q: %w", a.Region.Kind, kvtransfer.ErrUnsupported)
	}
	if a.Region.BlockBytes != src.BlockBytes {
		return nil, nil, fmt.Errorf("local blocks of %d bytes, remote %d: %w", a.Region.BlockBytes, src.BlockBytes, kvtransfer.ErrKVSize)
	}
	m, err := k.region(a.Region.Path, a.Region.BlockBytes)
	if err != nil {
		return nil, nil, err
	}
	done := func() { k.unref(m) }
	dst, err := m.reg.Blocks(a.BlockIDs)
	if err != nil {
		done()
		return nil, nil, err
	}
	return dst, done, nil
}

// region returns path's mapping with a reference taken. The cache holds
// MaxRegions mappings; past that an unused one is evicted and unmapped (an
// engine restart leaves its old file behind), and if every one is in use
// the new mapping is used once and unmapped after.
func (k *kvPull) region(path string, blockBytes int) (*mappedRegion, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if m, ok := k.regions[path]; ok && m.reg.BlockBytes() == blockBytes {
		m.refs++
		return m, nil
	}
	reg, err := kvtransfer.OpenHostRegion(path, blockBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", kvtransfer.ErrUnsupported, err)
	}
	m := &mappedRegion{reg: reg, refs: 1}
	if old, ok := k.regions[path]; ok { // same path, other block size
		k.evict(path, old)
	}
	if len(k.regions) >= k.cfg.MaxRegions {
		for p, old := range k.regions {
			if old.refs == 0 {
				k.evict(p, old)
				break
			}
		}
	}
	if len(k.regions) < k.cfg.MaxRegions {
		m.cached = true
		k.regions[path] = m
		// Registered once for every pull into it while it stays mapped;
		// if the transport refuses, each read registers its blocks.
		if k.local != nil && k.local.RegisterLocal(reg) == nil {
			m.registered = true
		}
	}
	return m, nil
}

// unmap deregisters m from the transport (no pull writes into it) and
// unmaps it. Called with k.mu held.
func (k *kvPull) unmap(m *mappedRegion) {
	if m.registered {
		_ = k.local.DeregisterLocal(m.reg)
		m.registered = false
	}
	_ = m.reg.Close()
}

// evict drops m from the cache, unmapping it unless a pull still writes
// into it (then its last user does). Called with k.mu held.
func (k *kvPull) evict(path string, m *mappedRegion) {
	delete(k.regions, path)
	m.cached = false
	if m.refs == 0 {
		k.unmap(m)
	}
}

// unref returns a reference taken by region.
func (k *kvPull) unref(m *mappedRegion) {
	k.mu.Lock()
	defer k.mu.Unlock()
	m.refs--
	if m.refs == 0 && !m.cached {
		k.unmap(m)
	}
}

// remember notes a prefiller's agent for the periodic probe (bounded).
func (k *kvPull) remember(agent, label string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.recent[agent]; !ok && len(k.recent) >= 64 {
		for a := range k.recent {
			delete(k.recent, a)
			break
		}
	}
	k.recent[agent] = label
}

// kvFailureReason maps a pull error to pd_sidecar_kv_pull_failures_total's
// reason label.
func kvFailureReason(err error) string {
	switch {
	case errors.Is(err, kvtransfer.ErrKVAborted):
		return metrics.KVPullAborted
	case errors.Is(err, kvtransfer.ErrKVSourceGone):
		return metrics.KVPullSourceGone
	case errors.Is(err, kvtransfer.ErrKVNotHeld):
		return metrics.KVPullNotHeld
	case errors.Is(err, kvtransfer.ErrKVChecksum):
		return metrics.KVPullChecksum
	case errors.Is(err, kvtransfer.ErrKVSize):
		return metrics.KVPullSize
	case errors.Is(err, kvtransfer.ErrKVDeadline):
		return metrics.KVPullDeadline
	case errors.Is(err, errKVAlloc):
		return metrics.KVPullAlloc
	}
	return metrics.KVPullOther
}

// kvPullFailure says what a failed pull becomes, and whether a local
// prefill may serve the request instead: a client that left is only that;
// a KV agent that is gone, or a descriptor that is refused, is the
// prefiller's fault and degrades; any other failure is a KV load failure,
// re-run locally as --on-kv-load-failure says.
func (r *request) kvPullFailure(err error) (error, bool) {
	var ue *upstream.UpstreamError
	if !errors.As(err, &ue) && !errors.Is(err, connectors.ErrInvalidKVParams) {
		// The agent's errors may quote its descriptor: said in fixed words.
		err = &upstream.UpstreamError{Role: upstream.RoleKVAgent, Reason: "KV pull failed (" + kvFailureReason(err) + ")", Err: err}
	}
	switch {
	case r.gone():
		return fmt.Errorf("%w: %w", ErrClientGone, err), false
	case errors.Is(err, kvtransfer.ErrKVSourceGone), errors.Is(err, connectors.ErrInvalidKVParams):
		return err, true
	}
	err = fmt.Errorf("%w: sidecar pull: %w", ErrKVLoadFailed, err)
	return err, r.kvLoadFailed()
}

// RunKVProbes probes the KV agents of recently used prefillers every
// interval (a bare round trip over the pull's own connection) into
// pd_sidecar_kv_probe_latency_seconds, until ctx ends. A no-op unless
// EnableKVPull was called.
func (p *Proxy) RunKVProbes(ctx context.Context, every time.Duration) {
	k := p.kv
	if k == nil || every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k.mu.Lock()
		agents := make(map[string]string, len(k.recent))
		for a, l := range k.recent {
			agents[a] = l
		}
		k.mu.Unlock()
		for agent, label := range agents {
			d, err := k.puller.Probe(ctx, agent, nil)
			if err != nil {
				p.log.Warn().Err(err).Str("agent", agent).Msg("kv probe failed")
				k.mu.Lock()
				delete(k.recent, agent)
				k.mu.Unlock()
				continue
			}
			k.m.ProbeLatency.WithLabelValues(label, k.puller.Transport().Name()).Observe(d.Seconds())
		}
	}
}
