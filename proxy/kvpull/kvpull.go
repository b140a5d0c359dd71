// Package kvpull is the sidecar-driven KV pull (--kv-connector sidecar):
// between the prefill answer and the decode leg, the sidecar borrows blocks
// of the local engine's host KV region (POST /kv/alloc), pulls the
// prefiller's blocks into them with a kvtransfer.Puller, and names them in
// the decode leg. A failed pull frees the borrowed blocks (POST /kv/free)
// and never reaches the engine. The engine side of the protocol is
// connectors/sidecar/CONTRACT.md.
//
// The package owns the protocol with the local engine and the prefiller's
// agent, the cache of mapped engine regions, the agents probed and the
// pull's metrics; what a request is (its id, its engine, its log, what a
// failed pull becomes for it) is the caller's, passed in a Request.
package kvpull

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

// Config configures the sidecar-driven KV pull.
type Config struct {
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
func (c Config) Validate() error {
	if c.AllocTimeout < 0 || c.AllocLease < 0 || c.MaxRegions < 0 {
		return fmt.Errorf("kv pull settings must not be negative: %+v", c)
	}
	return nil
}

// ErrAlloc: the local engine did not lend blocks.
var ErrAlloc = errors.New("local engine did not lend kv blocks")

// Sourcer is the connector ability the pull needs (connectors/sidecar's).
type Sourcer interface {
	KVSource(h connectors.Handoff) ([]byte, error)
	Preloaded(h connectors.Handoff, p sidecar.Preloaded) (connectors.Handoff, error)
}

// Deps is what a Puller needs of the sidecar. Every field is required.
type Deps struct {
	// Conn reads the handoff's kv_source and names the borrowed blocks in
	// the decode leg's handoff.
	Conn Sourcer
	// Puller pulls the blocks from the prefiller's agent.
	Puller *kvtransfer.Puller
	// Metrics are the pull's (pd_sidecar_kv_pull_*, the probes').
	Metrics *metrics.KVPull
	// FreeTimeout bounds the call that returns borrowed blocks.
	FreeTimeout time.Duration
}

// Request is the request a pull is made for, as the pull sees it.
type Request struct {
	// ID is the request's id, named in the allocation.
	ID string
	// Label is its prefiller's label on the pull's metrics.
	Label string
	// Local is the address of the local engine that lends the blocks,
	// named in the errors of its answers.
	Local string
	// Call POSTs a JSON body to path on the local engine: the answer's
	// body and status.
	Call func(ctx context.Context, path string, body []byte) ([]byte, int, error)
	// CallErr names a failed Call as an upstream.UpstreamError of the
	// local engine.
	CallErr func(err error) error
	// Log is the request's log event at a level; nil when not logged.
	Log func(l zerolog.Level) *zerolog.Event
}

// Puller is a sidecar's pull machinery: it borrows the local engine's
// blocks, pulls into them over its kvtransfer.Puller, and lends them to
// the decode leg; it keeps the engine regions it mapped and the agents it
// pulled from recently. Safe for concurrent use.
type Puller struct {
	cfg         Config
	conn        Sourcer
	puller      *kvtransfer.Puller
	m           *metrics.KVPull
	freeTimeout time.Duration

	// local registers cached mappings with the transport once, when it
	// can (nixl: a memory registration per read otherwise); nil if not.
	local localRegistrar

	mu      sync.Mutex
	regions map[string]*mappedRegion
	recent  map[string]string // agent address -> prefiller label, for probes
}

// New returns the pull machinery configured by cfg (valid: see
// Config.Validate), its zero settings taking their defaults.
func New(cfg Config, d Deps) *Puller {
	if cfg.AllocTimeout == 0 {
		cfg.AllocTimeout = 5 * time.Second
	}
	if cfg.AllocLease == 0 {
		cfg.AllocLease = 30 * time.Second
	}
	if cfg.MaxRegions == 0 {
		cfg.MaxRegions = 8
	}
	k := &Puller{cfg: cfg, conn: d.Conn, puller: d.Puller, m: d.Metrics, freeTimeout: d.FreeTimeout,
		regions: map[string]*mappedRegion{}, recent: map[string]string{}}
	k.local, _ = d.Puller.Transport().(localRegistrar)
	return k
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

// Pull pulls the handoff's KV into blocks borrowed from r's local engine
// and returns the decode leg's handoff naming them. On error nothing is
// borrowed any more and the remote hold was released (unless its agent is
// gone). The agent the handoff names is dialed: the caller has checked
// the addresses h names.
func (k *Puller) Pull(ctx context.Context, r Request, h connectors.Handoff) (connectors.Handoff, error) {
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
	a, err := k.alloc(ctx, r, src)
	if err == nil {
		var dst [][]byte
		var done func()
		if dst, done, err = k.destination(a, src); err == nil {
			_, err = k.puller.Pull(ctx, src, dst)
			done()
		}
		if err != nil {
			k.free(r, a.AllocID)
		}
	} else {
		_ = k.puller.Release(context.Background(), src)
	}
	if err != nil {
		k.m.Failures.WithLabelValues(r.Label, FailureReason(err)).Inc()
		return h, err
	}
	k.m.Duration.WithLabelValues(r.Label, tr).Observe(time.Since(start).Seconds())
	k.m.Bytes.WithLabelValues(r.Label, tr).Add(float64(src.Bytes()))
	k.remember(src.Agent, r.Label)
	r.Log(zerolog.DebugLevel).Str("transport", tr).Int("blocks", len(src.BlockIDs)).Int64("bytes", src.Bytes()).
		Dur("took", time.Since(start)).Msg("kv pulled into local blocks")
	return k.conn.Preloaded(h, sidecar.Preloaded{AllocID: a.AllocID, BlockIDs: a.BlockIDs, NumTokens: src.NumTokens})
}

// alloc borrows len(src.BlockIDs) blocks of r's local engine's region.
func (k *Puller) alloc(ctx context.Context, r Request, src kvtransfer.Source) (allocAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.AllocTimeout)
	defer cancel()
	body, _ := json.Marshal(map[string]any{
		"request_id": r.ID, "num_blocks": len(src.BlockIDs), "lease_ms": k.cfg.AllocLease.Milliseconds(),
	})
	var a allocAnswer
	b, status, err := r.Call(ctx, "/kv/alloc", body)
	switch {
	case err != nil:
		return a, fmt.Errorf("%w: %w", ErrAlloc, r.CallErr(err))
	case status != fasthttp.StatusOK: // its body is never said
		return a, fmt.Errorf("%w: %w", ErrAlloc, &upstream.UpstreamError{Role: upstream.RoleEngine, Reason: fmt.Sprintf("answered %d", status), Addr: r.Local})
	}
	if err := json.Unmarshal(b, &a); err != nil || a.AllocID == "" || len(a.BlockIDs) != len(src.BlockIDs) {
		return a, fmt.Errorf("%w: %w", ErrAlloc, &upstream.UpstreamError{Role: upstream.RoleEngine, Reason: "unusable answer", Addr: r.Local, Err: err})
	}
	return a, nil
}

// free returns borrowed blocks, best effort (the allocation's lease
// covers a failure here).
func (k *Puller) free(r Request, allocID string) {
	ctx, cancel := context.WithTimeout(context.Background(), k.freeTimeout)
	defer cancel()
	body, _ := json.Marshal(map[string]string{"alloc_id": allocID})
	if _, status, err := r.Call(ctx, "/kv/free", body); err != nil || status >= 300 {
		r.Log(zerolog.WarnLevel).Err(err).Int("status", status).Str("alloc_id", allocID).Msg("could not free borrowed kv blocks; their lease will")
	}
}

// remember notes a prefiller's agent for the periodic probe (bounded).
func (k *Puller) remember(agent, label string) {
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

// FailureReason maps a pull error to pd_sidecar_kv_pull_failures_total's
// reason label.
func FailureReason(err error) string {
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
	case errors.Is(err, ErrAlloc):
		return metrics.KVPullAlloc
	}
	return metrics.KVPullOther
}

// RunProbes probes the KV agents of recently used prefillers every
// interval (a bare round trip over the pull's own connection) into
// pd_sidecar_kv_probe_latency_seconds, logging to log the probes that
// fail, until ctx ends.
func (k *Puller) RunProbes(ctx context.Context, every time.Duration, log zerolog.Logger) {
	if every <= 0 {
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
				log.Warn().Err(err).Str("agent", agent).Msg("kv probe failed")
				k.mu.Lock()
				delete(k.recent, agent)
				k.mu.Unlock()
				continue
			}
			k.m.ProbeLatency.WithLabelValues(label, k.puller.Transport().Name()).Observe(d.Seconds())
		}
	}
}
