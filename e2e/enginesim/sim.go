// Package enginesim is a simulated LLM inference engine that speaks the
// engine side of every P/D protocol pd-sidecar drives: OpenAI-compatible
// completions and chat (JSON and SSE), the Responses, Messages and
// /inference/v1/generate bodies, vLLM NixlConnector kv_transfer_params with a
// real KV side channel, SGLang bootstrap rooms, and vLLM
// OffloadingConnector's P2P tier (remote_decoder, remote_prefiller,
// remote_kv_source). Output tokens are a deterministic function of the KV the
// decode step reads, and proof counters show what really happened, so tests
// can prove a split took place.
package enginesim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Sim is one simulated engine.
type Sim struct {
	cfg      Config
	shape    *wireShape    // the NIXL wire shape (--wire-shape)
	nextRank atomic.Uint64 // the Mooncake rank a prefill without a rank header runs on
	log      zerolog.Logger
	engineID string
	reg      *prometheus.Registry
	m        *simMetrics
	cache    *prefixCache
	holds    *holdStore
	faults   faultBox
	slots    chan struct{}
	// prefillSlots bounds the prefills computing at once (nil: unbounded;
	// see Config.PrefillSlots).
	prefillSlots chan struct{}
	journal      *journal
	ledger       *ledger
	store        *sharedStore // nil without SharedStorageDir
	// kva is the kvtransfer region and agent (nil without KVTransport).
	kva *kvAgent
	// ec holds encodings for consumers; ecm counts the encoder stage
	// (encoder.go).
	ec  ecStore
	ecm *ecMetrics
	// mio is MoRI-IO write mode's inbox and counters (moriio.go).
	mio *moriIO
	// hs are the prefiller engines this engine is connected to
	// (handshake.go).
	hs *handshakes
	// responses keeps answered /v1/responses responses (responses.go).
	responses *responseStore

	mu     sync.Mutex
	kvAddr *net.TCPAddr
	// bootAddr is the SGLang bootstrap listener's address.
	bootAddr *net.TCPAddr
	// p2pAddr is the P2P listener's address.
	p2pAddr *net.TCPAddr
	// clock0 is the origin of the engine's monotonic clock, on which a
	// pinned sequence's remote_blocks_expiry_time is given (bidirectional.go).
	clock0 time.Time
}

// New builds a simulator from a validated configuration.
func New(cfg Config, log zerolog.Logger) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Sim{
		cfg:       cfg,
		log:       log,
		engineID:  cfg.EngineID,
		reg:       prometheus.NewRegistry(),
		cache:     newPrefixCache(prefixCacheBlocks(cfg)),
		slots:     make(chan struct{}, cfg.MaxRunning),
		journal:   newJournal(200),
		ledger:    newLedger(ledgerLimit),
		clock0:    time.Now(),
		responses: newResponseStore(cfg.ResponsesStore),
	}
	if cfg.PrefillSlots > 0 {
		s.prefillSlots = make(chan struct{}, cfg.PrefillSlots)
	}
	if s.engineID == "" {
		s.engineID = randomHex(16)
	}
	shape, err := loadWireShape(cfg.WireShape)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	s.shape = shape
	s.m = newSimMetrics(s.reg, cfg.Model)
	s.ecm = newECMetrics(s.reg, cfg.Model)
	s.mio = newMoriIO(s.reg, cfg.Model, cfg.KVLease)
	s.hs = newHandshakes(cfg.KVHandshakeDelay, s.m.kvHandshakes)
	s.holds = newHoldStore(cfg.NumKVBlocks,
		func(held int, usage float64) {
			s.m.kvBlocksHeld.Set(float64(held))
			s.m.kvUsage.Set(usage)
		},
		func(h *hold) {
			s.m.leaseExpired.Inc()
			msg := "kv lease expired; blocks freed without a pull"
			if h.pinned {
				msg = "pinned sequence reached decoder_kv_blocks_ttl; blocks freed without a pull"
			}
			s.log.Warn().Str("request_id", h.requestID).Int("blocks", len(h.blocks)).Msg(msg)
		})
	s.faults.set(cfg.Faults)
	if cfg.SharedStorageDir != "" {
		st, err := newSharedStore(cfg.SharedStorageDir)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		s.store = st
	}
	if cfg.KVTransport != nil {
		kva, err := newKVAgent(s)
		if err != nil {
			return nil, err
		}
		s.kva = kva
	}
	return s, nil
}

// EngineID returns the id advertised as remote_engine_id.
func (s *Sim) EngineID() string { return s.engineID }

// Registry returns the simulator's metrics registry.
func (s *Sim) Registry() *prometheus.Registry { return s.reg }

// Listeners are the sockets a simulator serves on. KV and Bootstrap may be
// nil when the role does not need them; every role has a P2P listener.
type Listeners struct {
	HTTP, KV, Bootstrap, P2P net.Listener
	// MoriNotify is MoRI-IO's notify port (decode-capable roles with
	// MoriIONotifyPort set; moriio.go).
	MoriNotify net.Listener
}

// Listen opens the listeners the configuration and role call for.
func (s *Sim) Listen() (Listeners, error) {
	var ls Listeners
	open := func(port int) (net.Listener, error) {
		return net.Listen("tcp", net.JoinHostPort(s.cfg.Host, strconv.Itoa(port)))
	}
	var err error
	if ls.HTTP, err = open(s.cfg.Port); err != nil {
		return ls, fmt.Errorf("listen http: %w", err)
	}
	if ls.P2P, err = open(s.cfg.P2PPort); err != nil {
		ls.HTTP.Close()
		return ls, fmt.Errorf("listen p2p: %w", err)
	}
	if s.cfg.MoriIONotifyPort > 0 && s.cfg.canDecodeRemote() {
		if ls.MoriNotify, err = open(s.cfg.MoriIONotifyPort); err != nil {
			ls.HTTP.Close()
			ls.P2P.Close()
			return ls, fmt.Errorf("listen moriio notify: %w", err)
		}
	}
	if s.cfg.servesKV() {
		if ls.KV, err = open(s.cfg.KVPort); err != nil {
			ls.HTTP.Close()
			ls.P2P.Close()
			return ls, fmt.Errorf("listen kv side channel: %w", err)
		}
	}
	if s.cfg.canPrefillRemote() {
		if ls.Bootstrap, err = open(s.cfg.BootstrapPort); err != nil {
			ls.HTTP.Close()
			ls.P2P.Close()
			ls.KV.Close()
			return ls, fmt.Errorf("listen sglang bootstrap: %w", err)
		}
	}
	return ls, nil
}

// Serve serves on ls until ctx ends, then shuts the HTTP server down.
func (s *Sim) Serve(ctx context.Context, ls Listeners) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 5)
	if s.kva != nil {
		if err := s.kva.start(ctx, s.cfg.Host); err != nil {
			return err
		}
		defer s.kva.stop()
	}
	if ls.KV != nil {
		s.mu.Lock()
		s.kvAddr = ls.KV.Addr().(*net.TCPAddr)
		s.mu.Unlock()
		go func() { errc <- s.serveKV(ctx, ls.KV) }()
	}
	if ls.Bootstrap != nil {
		s.mu.Lock()
		s.bootAddr = ls.Bootstrap.Addr().(*net.TCPAddr)
		s.mu.Unlock()
		go func() { errc <- s.serveBootstrap(ctx, ls.Bootstrap) }()
	}
	if ls.MoriNotify != nil {
		go func() { errc <- s.serveMoriNotify(ctx, ls.MoriNotify) }()
	}
	if ls.P2P != nil {
		s.mu.Lock()
		s.p2pAddr = ls.P2P.Addr().(*net.TCPAddr)
		s.mu.Unlock()
		go func() { errc <- s.serveP2P(ctx, ls.P2P) }()
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { errc <- srv.Serve(ls.HTTP) }()
	s.log.Info().Str("http", ls.HTTP.Addr().String()).Str("role", string(s.cfg.Role)).
		Str("engine_id", s.engineID).Str("kv", addrString(ls.KV)).Str("bootstrap", addrString(ls.Bootstrap)).
		Str("p2p", addrString(ls.P2P)).
		Msg("engine-sim serving")
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	shut, cancelShut := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelShut()
	_ = srv.Shutdown(shut)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func addrString(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// KVAddr returns the side channel address advertised to decoders.
func (s *Sim) KVAddr() *net.TCPAddr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kvAddr
}

// BootstrapAddr returns the SGLang/Mooncake bootstrap listener's address
// (nil until Serve started it, or when the role has none).
func (s *Sim) BootstrapAddr() *net.TCPAddr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bootAddr
}

// P2PAddr returns the P2P listener's address (nil until Serve started it).
func (s *Sim) P2PAddr() *net.TCPAddr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p2pAddr
}

// HeldBlocks returns the number of KV blocks held for remote decoders.
func (s *Sim) HeldBlocks() int { return s.holds.heldBlocks() }

// SetFaults replaces the fault plan.
func (s *Sim) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	s.faults.set(f)
	return nil
}

func (s *Sim) blockBytes() int { return s.cfg.blockBytes() }

func randomHex(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// prefixCacheBlocks is the prefix cache's capacity: the KV cache's, or
// none with NoPrefixCaching.
func prefixCacheBlocks(cfg Config) int {
	if cfg.NoPrefixCaching {
		return 0
	}
	return cfg.NumKVBlocks
}
