// Package core is one inference request's state and every decision on it,
// and what the requests of a sidecar share (Sidecar: configuration,
// connector, guards, breakers, metrics, the registered admitters, request
// features and background work). A request is admitted (Request.Admit),
// its features take part at the points both drivers pass through
// (feature.Uses), and each choreography has its request side —
// Sequential, Paired, DecodeFirst — that builds the legs, judges what a
// leg's answer says, and does the split machines' (proxy/split)
// accounting; answers, failures and rejections are the request's to make.
// It imports neither fasthttp, nor netloop, nor net's I/O (only its
// address parsing): the drivers (proxy/godriver with proxy/relay, and
// proxy/lane) feed it facts and execute what it decides, and
// proxy/inference composes it with them.
package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/bootstrap"
	"github.com/pd-sidecar/pd-sidecar/proxy/chunked"
	"github.com/pd-sidecar/pd-sidecar/proxy/dprank"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
	"github.com/pd-sidecar/pd-sidecar/proxy/hedge"
	"github.com/pd-sidecar/pd-sidecar/proxy/hideparams"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvpull"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvrelease"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvsource"
	"github.com/pd-sidecar/pd-sidecar/proxy/moriwrite"
	"github.com/pd-sidecar/pd-sidecar/proxy/multiturn"
	"github.com/pd-sidecar/pd-sidecar/proxy/observe"
	"github.com/pd-sidecar/pd-sidecar/proxy/passpolicy"
	"github.com/pd-sidecar/pd-sidecar/proxy/prefillstrip"
	"github.com/pd-sidecar/pd-sidecar/proxy/prevresponse"
	"github.com/pd-sidecar/pd-sidecar/proxy/prewarm"
	"github.com/pd-sidecar/pd-sidecar/proxy/sanitize"
	"github.com/pd-sidecar/pd-sidecar/proxy/shortprompt"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Header names the sidecar reads or sets.
const (
	// HeaderPrefiller names the prefill engine(s) (host:port, comma
	// separated). Client controllable: stripped before forwarding.
	HeaderPrefiller = "x-prefiller-host-port"
	// HeaderRequestID is set (never added twice) on every leg.
	HeaderRequestID = "X-Request-ID"
)

// Sidecar is what every request of the sidecar shares: its
// configuration, connector, transports, guards, breakers and metrics, the
// registered admitters, request features and background work, and what it
// knows of its pod. Create it with NewSidecar; proxy/inference composes it
// with the drivers.
type Sidecar struct {
	Cfg      Config
	Conn     connectors.Connector
	Rewriter connectors.AnswerRewriter // nil when conn has no such ability
	seq      connectors.Sequential     // nil for a Concurrent connector
	Mori     *moriwrite.State          // MoRI-IO write mode; nil when off
	Choreo   connectors.Choreography   // what conn declares (connectors.Choreography)
	Boot     *bootstrap.Cache          // Bootstrapper answers per prefiller
	Tr       *upstream.Transport
	EncTr    *upstream.Transport // the encoder legs'; nil: stage off
	M        *metrics.Metrics
	Log      zerolog.Logger
	Draining atomic.Bool
	Observer Observer // told each request's report (Observe); nil: none
	// prefillDrops are the client headers the features leave out of a
	// prefill leg (feature.PrefillHeadDropper), lower case (setStrips).
	prefillDrops []string
	Bufs         sse.Bufs // per-stream buffers for reuse
	// hedge is hedged prefill's policy; nil: off.
	hedge *hedge.Policy
	// pass is what passes through to the engine.
	Pass *passpolicy.Policy
	// Guard holds the limits, SSRF protection, circuit breakers and TLS.
	Guard *guard.Guard
	// warm warms up new prefillers (--prefill-prewarm); nil: off.
	warm *prewarm.Warmer
	// kvr frees a prefiller's KV nobody read (--release-kv-on-cancel);
	// nil: off.
	kvr *kvrelease.Releaser
	// KV is the sidecar-driven KV pull (see EnableKVPull); nil: off.
	KV *kvpull.Puller
	// tracer is the registered feature that traces requests from their
	// head on (feature.RequestTracer; Observe registers it); nil: none.
	tracer feature.RequestTracer
	// background is the work Run runs beside serving: MoRI-IO's host
	// revalidations, warm-ups, circuit probes, KV release legs, of those
	// that are on, in start order.
	Background []backgroundWork
	// Clean makes the bodies the sidecar forwards what may reach an
	// engine: an inference request's as its admitter, a passthrough
	// request's.
	Clean *sanitize.Cleaner
	// admitters are the parts of every request's admission that are on,
	// in their order (Request.Admit); features are the request features
	// that are on, in the order they take part in a request once its
	// prefiller is named: one line each in New.
	admitters []feature.Admitter
	features  []feature.Feature
	// pod is what the sidecar knows of its pod: ports, engines, addresses.
	pod pod
	// sessionHeader names the session key's header, with multi-turn KV
	// reuse on ("": off); sweep drops its expired entries.
	sessionHeader string
	sweep         *multiturn.Sweeper
	// pinr sends the release legs of pinned histories no turn will read
	// (nil: --bidirectional-release-unread off, or multi-turn reuse off).
	pinr *pinReleaser
	// LegStrip are the client's headers the lane leaves out of every leg
	// it writes (the trace context's, which each leg carries anew),
	// SplitStrip those it leaves out of a split's legs (MoRI-IO's rank
	// header too, which it sets), and PrefillStrip those it leaves out of
	// a prefill leg (--prefill-strip-headers too); lower case (setStrips).
	LegStrip, SplitStrip, PrefillStrip []string
}

// PrefillStrips are the headers left out of a prefill leg
// (--prefill-strip-headers), lower case.
func (p *Sidecar) PrefillStrips() []string { return p.prefillDrops }

// NewSidecar returns a Sidecar. cfg must be valid (see Config.Validate); m
// holds the collectors, log receives JSON logs. The encoder stage's
// admitter, which leaves through fasthttp's client, is added by the
// composition (AddAdmitter).
func NewSidecar(cfg Config, conn connectors.Connector, m *metrics.Metrics, log zerolog.Logger) (*Sidecar, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Sidecar{
		Cfg:  cfg,
		Conn: conn,
		Tr:   upstream.NewTransport(cfg.ConnectTimeout, cfg.MaxConnsPerHost, cfg.MaxPrefillers+cfg.DataParallelSize),
		M:    m,
		Log:  log,
	}
	p.pod = pod{cfg: &p.Cfg}
	p.Tr.SetAnswerLimits(cfg.MaxUpstreamAnswerBytes, cfg.Guard.MaxHeaderBytes)
	pass, err := passpolicy.New(cfg.Passthrough)
	if err != nil {
		return nil, err
	}
	p.Pass = pass
	p.Rewriter, _ = conn.(connectors.AnswerRewriter)
	g, err := newGuard(cfg.Guard, cfg.MaxRequestBodyBytes, m.Guards, log)
	if err != nil {
		return nil, err
	}
	p.Guard = g
	p.Tr.SetAnswerBudget(g.Budget()) // answers read whole draw from --max-buffered-bytes
	upTLS, err := cfg.Guard.TLS.Upstream(p.pod.localAddrs())
	if err != nil {
		return nil, err
	}
	p.Tr.UseTLS(upTLS)
	p.seq, _ = conn.(connectors.Sequential)
	if p.Choreo = connectors.ChoreographyOf(conn); p.Choreo == 0 {
		return nil, fmt.Errorf("connector %q is neither sequential nor concurrent", conn.Name())
	}
	p.Boot = bootstrap.New(cfg.MaxPrefillers, bootstrapTransportErr)
	p.Clean = &sanitize.Cleaner{TrustClientKVParams: cfg.Guard.TrustClientKVParams, Allowlist: cfg.Guard.Allowlist,
		Guards: m.Guards, BadRequest: ErrBadRequest}
	// What every request's admission runs, in this order: the rank picked
	// before anything reads the request, the body made what may reach an
	// engine, the session key read from it, the encoder stage on it.
	p.admitters = append(p.admitters, dprank.Picker{Pod: p.pod.dpPod(), Engines: p.pod.localAddrs(), Rejected: m.Guards.Rejected})
	p.admitters = append(p.admitters, p.Clean)
	if cfg.Multiturn.Enabled && cfg.Multiturn.SessionHeader != "" {
		p.admitters = append(p.admitters, multiturn.SessionReader{Header: cfg.Multiturn.SessionHeader, BadRequest: ErrBadRequest})
	}
	if cfg.MoriIO.WriteMode && p.seq != nil && conn.Name() == "nixlv2" {
		p.Mori = moriwrite.NewState(cfg.MoriIO, m.MoriIO, log) // MoRI-IO write mode
		p.seq = moriio.ReadHandoffs(p.seq)                     // its prefill answers are MoRI-IO's
		p.features = append(p.features, moriwrite.Feature{State: p.Mori})
	}
	// Always on: no split of a conversation the decode engine holds can be right.
	p.features = append(p.features, prevresponse.Guard{})
	if len(cfg.PrefillStripHeaders) > 0 {
		p.features = append(p.features, prefillstrip.Feature{Names: prefillstrip.Names(cfg.PrefillStripHeaders)})
	}
	if cfg.DecodeChunkSize > 0 {
		p.features = append(p.features, chunked.Feature{Size: cfg.DecodeChunkSize, Remote: conn.Name() == nixlv2.Name})
	}
	if cfg.MinRemotePrefillTokens > 0 {
		p.features = append(p.features, shortprompt.Guard{Limit: cfg.MinRemotePrefillTokens})
	}
	if cfg.P2P.Enabled {
		p.features = append(p.features, kvsource.Feature{Ports: p.pod.p2pPorts(), Allowlist: cfg.Guard.Allowlist, OwnHost: p.pod.ownHost, Outcomes: m.KVSources, NewID: NewUUID})
	}
	if mt := cfg.Multiturn; mt.Enabled {
		if conn.Name() != "nixlv2" || cfg.MoriIO.WriteMode {
			return nil, fmt.Errorf("--enable-bidirectional-kv-xfer needs --kv-connector nixlv2 (vLLM's NixlConnector pull mode), not %q", conn.Name())
		}
		if last := mt.SideChannelPort + cfg.DataParallelSize - 1; last > 65535 {
			return nil, fmt.Errorf("--decode-side-channel-port %d plus the data-parallel ranks (--data-parallel-size %d) passes port 65535", mt.SideChannelPort, cfg.DataParallelSize)
		}
		if p.pod.podAddr() == "" {
			log.Warn().Msg("--enable-bidirectional-kv-xfer keeps no history: the sidecar knows no address of its pod (POD_IP, or --host naming one address) to check a decode answer's side channel against")
		}
		store := multiturn.NewStore(multiturn.StoreConfig{MaxEntries: mt.CacheSize, MaxBytes: mt.CacheBytes,
			ClientShare: mt.CacheClientShare, TTL: mt.CacheTTL - MultiturnMargin(mt.CacheTTL)})
		pins := multiturn.NewPins(mt.CacheTTL, nil)
		var release multiturn.PinReleaser
		if mt.ReleaseUnread {
			p.pinr = newPinReleaser(p)
			release = p.pinr
		}
		p.features = append(p.features, &multiturn.Feature{Store: store, Pins: pins, Release: release, Threshold: mt.RecomputeThreshold,
			PodAddr: p.pod.podAddr(), SideChannelPort: mt.SideChannelPort, Ranks: cfg.DataParallelSize,
			KeepReasoning: mt.KeepReasoning, M: m.Multiturn})
		p.sessionHeader = mt.SessionHeader
		p.sweep = &multiturn.Sweeper{Store: store, Every: min(mt.CacheTTL/8, time.Minute), Held: m.Multiturn.Held,
			Pins: pins, PinnedTokens: m.Multiturn.PinnedTokens}
	}
	if !cfg.Guard.TrustClientKVParams {
		p.features = append(p.features, hideparams.Feature{}) // after multi-turn, which reads the params
	}
	p.hedge = hedge.New(cfg.Hedge, m.Hedge)
	if cfg.Hedge.On() && p.Choreo == connectors.ChoreographyConcurrent {
		log.Warn().Str("connector", conn.Name()).Msg("--prefill-hedge-after has no effect: this connector sends the decode leg while the prefill runs, so there is no wait to hedge")
	}

	p.setStrips()
	if cfg.PrefillPrewarm {
		p.warm = newPrewarmer(p)
	}
	p.kvr = newKVReleaser(p)
	// The background work of what is on, in the order Run starts it
	// (and stops it in reverse).
	if p.Mori != nil {
		p.Background = append(p.Background, backgroundWork{Background: p.Mori.Dns, ThroughDrain: true})
	}
	if p.warm != nil {
		p.Background = append(p.Background, backgroundWork{Background: p.warm})
	}
	if pr := newCircuitProber(p.Guard, cfg.ConnectTimeout); pr != nil {
		p.Background = append(p.Background, backgroundWork{Background: pr})
	}
	if p.kvr != nil {
		p.Background = append(p.Background, backgroundWork{Background: p.kvr, ThroughDrain: true})
	}
	if p.sweep != nil {
		p.Background = append(p.Background, backgroundWork{Background: p.sweep})
	}
	if p.pinr != nil {
		p.Background = append(p.Background, backgroundWork{Background: p.pinr.r, ThroughDrain: true})
	}
	return p, nil
}

// localAddr is the local engine of data-parallel rank r.
func (p *Sidecar) LocalAddr(rank int) string { return p.pod.localAddr(rank) }

// Observe installs the requests' observer (nil: none) and their tracer
// and propagator (nil: none; W3C trace context). Call it before Run.
func (p *Sidecar) Observe(o Observer, tracer trace.Tracer, prop propagation.TextMapPropagator) {
	p.Observer = o
	if t := observe.NewTracing(observe.Config{Tracer: tracer, Propagator: prop,
		Reason: failureReason, KVLoadFailed: failure.ReasonKVLoadFailed}); t != nil {
		p.features = append(p.features, t)
	}
	p.setStrips()
}

// AddAdmitter registers a, last, among the admitters every request's
// admission runs. Call it before Run.
func (p *Sidecar) AddAdmitter(a feature.Admitter) { p.admitters = append(p.admitters, a) }

// AddBackground registers w, last, among the background work Run runs.
// Call it before Run.
func (p *Sidecar) AddBackground(w Background) {
	p.Background = append(p.Background, backgroundWork{Background: w})
}

// ChunkDeps is what a chunked decode (proxy/chunked) needs of the sidecar.
func (p *Sidecar) ChunkDeps() chunked.Deps {
	return chunked.Deps{Metrics: p.M.Chunked, BadRequest: ErrBadRequest, DecodeFailed: ErrDecodeFailed,
		ClientGone: ErrClientGone, KVLoadFailed: ErrKVLoadFailed, ErrorBody: chunkErrorBody}
}

// chunkErrorBody is the sidecar's error object answering err: a failed
// chunk's with its status, another with the status of its outcome.
func chunkErrorBody(err error) []byte {
	var cf *chunked.Failed
	if errors.As(err, &cf) {
		return ErrorBody(cf.Status, err)
	}
	return FailureBody(err)
}

// pinsSplitRank reports whether the sidecar sets x-data-parallel-rank on
// the legs of a request that names a prefiller (MoRI-IO write mode with
// more than one data-parallel rank): the client's own never reaches them.
func (p *Sidecar) pinsSplitRank() bool { return p.Mori != nil && p.Mori.Cfg.Ports.DPSize > 1 }

// ranksPrefill reports whether the connector names the prefill leg's rank
// (connectors.PrefillRanker): the client's x-data-parallel-rank never
// reaches a prefiller then.
func (p *Sidecar) ranksPrefill() bool {
	_, ok := p.Conn.(connectors.PrefillRanker)
	return ok
}

// setStrips sets the headers the lane leaves out of legs (LegStrip).
func (p *Sidecar) setStrips() {
	p.prefillDrops, p.LegStrip, p.tracer = nil, nil, nil
	for _, f := range p.features {
		if d, ok := f.(feature.PrefillHeadDropper); ok {
			p.prefillDrops = append(p.prefillDrops, d.PrefillDrops()...)
		}
		if d, ok := f.(feature.LegHeadDropper); ok {
			p.LegStrip = append(p.LegStrip, d.LegDrops()...)
		}
		if t, ok := f.(feature.RequestTracer); ok && p.tracer == nil {
			p.tracer = t
		}
	}
	p.PrefillStrip = append(slices.Clone(p.prefillDrops), p.LegStrip...)
	if p.sessionHeader != "" {
		// Multi-turn KV reuse consumes the session key: no leg carries it
		// (LegSpec.Session on fasthttp's path).
		s := strings.ToLower(p.sessionHeader)
		p.LegStrip = append(slices.Clone(p.LegStrip), s)
		p.PrefillStrip = append(slices.Clone(p.PrefillStrip), s)
	}
	p.SplitStrip = p.LegStrip
	if p.pinsSplitRank() {
		p.SplitStrip = append(slices.Clone(p.LegStrip), moriio.HeaderRank)
		p.PrefillStrip = append(slices.Clone(p.PrefillStrip), moriio.HeaderRank)
	} else if p.ranksPrefill() {
		p.PrefillStrip = append(slices.Clone(p.PrefillStrip), moriio.HeaderRank)
	}
}

// logsLegs reports whether legs are logged (trace level).
func (p *Sidecar) LogsLegs() bool { return observe.LogsLegs(p.Log.GetLevel()) }

// EngineCall POSTs a JSON body to path on the local engine local, under
// the request id id: the answer's body and status.
type EngineCall func(ctx context.Context, local, id, path string, body []byte) ([]byte, int, error)

// EnableKVPull makes the sidecar pull the KV itself between prefill and
// decode, calling the local engine with call: the pull is a request
// feature (kvpull.Feature), registered here last. The connector must have the sidecar-pull ability. Call it before
// Run.
func (p *Sidecar) EnableKVPull(cfg kvpull.Config, puller *kvtransfer.Puller, m *metrics.KVPull, call EngineCall) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	src, ok := p.Conn.(kvpull.Sourcer)
	if !ok {
		return fmt.Errorf("connector %q cannot hand off a kv source for the sidecar to pull", p.Conn.Name())
	}
	p.KV = kvpull.New(cfg, kvpull.Deps{Conn: src, Puller: puller, Metrics: m,
		FreeTimeout: p.Cfg.ConnectTimeout + time.Second})
	p.features = append(p.features, kvpull.Feature{Puller: p.KV, Allowed: p.addrsAllowed, Call: call, CallErr: engineCallErr})
	return nil
}

// RunKVProbes probes the KV agents of recently used prefillers every
// interval (a bare round trip over the pull's own connection) into
// pd_sidecar_kv_probe_latency_seconds, until ctx ends
// (kvpull.Puller.RunProbes). A no-op unless EnableKVPull was called.
func (p *Sidecar) RunKVProbes(ctx context.Context, every time.Duration) {
	if p.KV != nil {
		p.KV.RunProbes(ctx, every, p.Log)
	}
}

// NotePrefiller tells the proxy that hostport (host:port) is a prefiller
// now (the InferencePool watcher's new Ready pod): with --prefill-prewarm
// it is warmed up, even when seen before (a pod that came back is a new
// engine, with no connection to the local one). It never blocks.
func (p *Sidecar) NotePrefiller(hostport string) {
	p.warm.Saw(hostport, true)
}

// PairedSplit reports whether the proxy's splits run both legs at once
// (split.Paired): a concurrent connector, or MoRI-IO's parallel dispatch.
func (p *Sidecar) PairedSplit() bool {
	return p.Choreo == connectors.ChoreographyConcurrent || (p.Mori != nil && p.Mori.Cfg.ParallelDispatch)
}

// prewarmCovered reports why the connector's split cannot be warmed up,
// or "" when it can: only a sequential split whose decode leg hands the
// local engine the prefill's kv_transfer_params and lets it pull the KV
// (nixlv2) has an engine-to-engine handshake to pay ahead. The concurrent
// connectors (sglang, mooncake, offloading) are not built for it, the
// decode-first one (shared-storage) moves KV through storage, the sidecar's
// own pull (--kv-connector sidecar) is not the engine's, and MoRI-IO write
// mode's prefiller writes into the decoder with per-request fields.
func (p *Sidecar) prewarmCovered() string {
	switch {
	case p.seq == nil || p.Choreo != connectors.ChoreographySequential:
		return "the connector's split is not a prefill then a decode" // a constant: asked on every request
	case p.KV != nil:
		return "the sidecar pulls the KV itself"
	case p.Mori != nil:
		return "MoRI-IO write mode"
	}
	return ""
}

// hedgeable reports whether the request's prefill may be hedged: hedging
// is on and the split is the plain sequential one (a MoRI-IO write or the
// sidecar's own KV pull follow the prefill, and the local leg would have
// to undo them).
func (p *Sidecar) hedgeable() bool {
	return p.hedge != nil && p.Mori == nil && p.KV == nil
}
