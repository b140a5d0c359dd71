package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// The kvtransfer side of the simulator (the sidecar connector, see
// connectors/sidecar/CONTRACT.md). With Config.KVTransport set the engine
// keeps its KV blocks in a host region, a shared-memory file: block id i at
// offset i*BlockBytes. As a prefiller asked for pull_mode "sidecar" it writes
// the prompt's blocks there, holds them with a kvtransfer agent and answers
// a kv_source descriptor. As a decoder it lends blocks of its region to a
// sidecar (POST /kv/alloc), which pulls into them, and decodes from them
// when the decode leg names them in kv_preloaded.

// PullModeSidecar is the kv_transfer_params.pull_mode asking a prefiller for
// a kv_source descriptor.
const PullModeSidecar = "sidecar"

// preloaded is kv_transfer_params.kv_preloaded of a decode leg.
type preloaded struct {
	AllocID   string `json:"alloc_id"`
	BlockIDs  []int  `json:"block_ids"`
	NumTokens int    `json:"num_tokens"`
}

// kvAgent is the engine's region, agent and local allocations.
type kvAgent struct {
	s      *Sim
	tr     kvtransfer.Transport
	region *kvtransfer.Region
	agent  *kvtransfer.Agent
	m      *metrics.KVAgent
	// allocs, frees and preloadedDecodes are proof counters of the
	// decode side: blocks lent to a sidecar, returned unused, and decodes
	// that used pulled blocks.
	allocs, frees, preloadedDecodes prometheus.Counter
	mu                              sync.Mutex
	listener                        kvtransfer.Listener
}

// newKVAgent creates the region file and the agent.
func newKVAgent(s *Sim) (*kvAgent, error) {
	dir := s.cfg.KVRegionDir
	if dir == "" {
		dir = os.TempDir()
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			dir = "/dev/shm"
		}
	}
	path := filepath.Join(dir, "engine-sim-"+s.engineID+".kv")
	region, err := kvtransfer.CreateHostRegion(path, s.cfg.NumKVBlocks, s.blockBytes())
	if err != nil {
		return nil, err
	}
	k := &kvAgent{s: s, tr: s.cfg.KVTransport, region: region, m: metrics.NewKVAgent(s.reg)}
	labels := prometheus.Labels{"model_name": s.cfg.Model, "engine": "0"}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		s.reg.MustRegister(c)
		return c
	}
	k.allocs = counter("sim_kv_allocs_total", "Block allocations lent to a sidecar to pull into (POST /kv/alloc).")
	k.frees = counter("sim_kv_frees_total", "Block allocations a sidecar returned unused (POST /kv/free).")
	k.preloadedDecodes = counter("sim_kv_preloaded_decodes_total", "Decodes that started from blocks a sidecar pulled into this engine's region.")
	k.agent = kvtransfer.NewAgent(kvtransfer.AgentConfig{
		EngineID:  s.engineID,
		Lease:     s.cfg.KVLease,
		Bandwidth: s.cfg.KVBandwidth,
		OnHeld:    func(n int) { k.m.HeldBlocks.Set(float64(n)) },
		OnRelease: k.released,
	})
	k.agent.Register(region)
	return k, nil
}

// start listens on host:KVAgentPort until ctx ends.
func (k *kvAgent) start(ctx context.Context, host string) error {
	l, err := k.tr.Listen(ctx, net.JoinHostPort(host, strconv.Itoa(k.s.cfg.KVAgentPort)), k.agent)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.listener = l
	k.mu.Unlock()
	k.s.log.Info().Str("transport", k.tr.Name()).Str("addr", l.Addr()).Str("region", k.region.Path()).Msg("kvtransfer agent serving")
	return nil
}

// stop ends every hold, closes the listener, unmaps and removes the region.
func (k *kvAgent) stop() {
	k.mu.Lock()
	l := k.listener
	k.mu.Unlock()
	if l != nil {
		_ = l.Close()
	}
	k.agent.Close()
	path := k.region.Path()
	_ = k.region.Close()
	_ = os.Remove(path)
}

// addr is the agent address to advertise; a wildcard host is replaced by
// the address the client reached us at.
func (k *kvAgent) addr(localHost string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.listener == nil {
		return ""
	}
	a := k.listener.Addr()
	host, port, err := net.SplitHostPort(a)
	if err == nil && localHost != "" {
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			return net.JoinHostPort(localHost, port)
		}
	}
	return a
}

// released frees a hold's blocks once the agent ends it.
func (k *kvAgent) released(h kvtransfer.HoldInfo, reason string) {
	k.m.Releases.WithLabelValues(reason).Inc()
	if hh, ok := k.s.holds.get(h.RequestID); ok {
		k.s.holds.release(hh)
	}
	if reason == kvtransfer.ReasonExpired {
		k.s.m.leaseExpired.Inc()
		k.s.log.Warn().Str("request_id", h.RequestID).Int("blocks", len(h.BlockIDs)).Msg("kv lease expired; agent freed blocks without a pull")
		return
	}
	k.s.log.Debug().Str("request_id", h.RequestID).Str("reason", reason).Msg("kv hold ended")
}

// export writes h's blocks into the region, hands the hold to the agent
// (which owns its lease from now on) and adds the kv_source descriptor to
// the answer's kv_transfer_params.
func (k *kvAgent) export(h *hold, lease time.Duration, o *output) error {
	h.timer.Stop() // the agent's lease governs this hold
	for i, id := range h.blockIDs {
		dst, err := k.region.Block(id)
		if err != nil {
			k.s.holds.release(h)
			return err
		}
		copy(dst, h.blocks[i])
		if h.corrupt && i == len(h.blockIDs)/2 {
			dst[len(dst)/3] ^= 0x5a // after the checksum: the puller must notice
		}
	}
	if lease <= 0 {
		lease = time.Nanosecond
	}
	src, err := k.agent.Hold(kvtransfer.Hold{
		RequestID: h.requestID, Region: k.region, BlockIDs: h.blockIDs,
		NumTokens: h.tokens, Checksums: h.checksums, Lease: lease,
	})
	if err != nil {
		k.s.holds.release(h)
		return err
	}
	h.exported = true
	src.Agent, src.Transport = k.addr(o.localHost), k.tr.Name()
	o.kv["kv_source"] = src
	return nil
}

// allocReq is POST /kv/alloc.
type allocReq struct {
	RequestID string `json:"request_id"`
	NumBlocks int    `json:"num_blocks"`
	LeaseMS   int64  `json:"lease_ms"`
}

// regionInfo describes the region to a sidecar.
type regionInfo struct {
	Kind       kvtransfer.Kind `json:"kind"`
	Path       string          `json:"path"`
	BlockBytes int             `json:"block_bytes"`
	NumBlocks  int             `json:"num_blocks"`
}

func (k *kvAgent) info() regionInfo {
	return regionInfo{Kind: kvtransfer.KindHost, Path: k.region.Path(), BlockBytes: k.region.BlockBytes(), NumBlocks: k.region.NumBlocks()}
}

// handleAlloc lends num_blocks blocks of the region to a sidecar for a
// lease (default the engine's --kv-lease).
func (k *kvAgent) handleAlloc(w http.ResponseWriter, r *http.Request) {
	var req allocReq
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil || req.NumBlocks <= 0 {
		writeError(w, http.StatusBadRequest, "BadRequestError", "num_blocks", "kv alloc: num_blocks must be a positive integer")
		return
	}
	lease := time.Duration(req.LeaseMS) * time.Millisecond
	if lease <= 0 {
		lease = k.s.cfg.KVLease
	}
	h := &hold{requestID: "alloc-" + randomHex(16), blocks: make([][]byte, req.NumBlocks)}
	if err := k.s.holds.add(h, lease); err != nil {
		status := http.StatusServiceUnavailable
		writeError(w, status, errorType(status), "", err.Error())
		return
	}
	k.allocs.Inc()
	k.s.log.Debug().Str("request_id", req.RequestID).Str("alloc_id", h.requestID).Int("blocks", req.NumBlocks).Msg("kv blocks lent to sidecar")
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"alloc_id": h.requestID, "block_ids": h.blockIDs, "lease_ms": lease.Milliseconds(), "region": k.info(),
	})
}

// handleFree returns lent blocks (a failed or abandoned pull).
func (k *kvAgent) handleFree(w http.ResponseWriter, r *http.Request) {
	var req struct {
		AllocID string `json:"alloc_id"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil || req.AllocID == "" {
		writeError(w, http.StatusBadRequest, "BadRequestError", "alloc_id", "kv free: alloc_id is required")
		return
	}
	h, ok := k.s.holds.get(req.AllocID)
	if !ok || !k.s.holds.release(h) {
		writeError(w, http.StatusNotFound, "NotFoundError", "alloc_id", "kv free: no such allocation")
		return
	}
	k.frees.Inc()
	w.WriteHeader(http.StatusNoContent)
}

// errPreloaded wraps every refusal of a kv_preloaded decode.
var errPreloaded = errors.New("bad kv_preloaded")

// loadPreloaded reads the blocks a sidecar pulled into the region and frees
// them. It returns their fingerprints, in prompt order.
func (k *kvAgent) loadPreloaded(p *preloaded, prompt, blocks int) ([]uint64, error) {
	h, ok := k.s.holds.get(p.AllocID)
	if !ok {
		return nil, fmt.Errorf("%w: %w: allocation %q not found (expired or freed)", ErrKVPull, errPreloaded, p.AllocID)
	}
	defer k.s.holds.release(h)
	switch {
	case !slices.Equal(h.blockIDs[:min(len(h.blockIDs), len(p.BlockIDs))], p.BlockIDs) || len(p.BlockIDs) == 0:
		return nil, fmt.Errorf("%w: %w: block ids %v are not allocation %q's", ErrKVPull, errPreloaded, p.BlockIDs, p.AllocID)
	case p.NumTokens != prompt || len(p.BlockIDs) != blocks:
		return nil, fmt.Errorf("%w: %w: %d tokens in %d blocks, prompt has %d tokens in %d blocks",
			ErrKVPull, errPreloaded, p.NumTokens, len(p.BlockIDs), prompt, blocks)
	}
	fps := make([]uint64, len(p.BlockIDs))
	for i, id := range p.BlockIDs {
		b, err := k.region.Block(id)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrKVPull, err)
		}
		fps[i] = Fingerprint(b)
	}
	k.preloadedDecodes.Inc()
	return fps, nil
}
