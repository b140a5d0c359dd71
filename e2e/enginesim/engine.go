package enginesim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// errKVLoadFailed is returned by loadKV when a remote KV load failed under
// the "fail" policy.
var errKVLoadFailed = errors.New("kv load failed")

// classify decides which leg of a split a request is, logging and counting
// unusable kv_transfer_params as vLLM does (it prefills locally).
func (s *Sim) classify(g *genRequest, rid string) legKind {
	if g.kvInvalid != "" {
		s.m.invalidKVParams.Inc()
		s.log.Warn().Str("request_id", rid).Str("reason", g.kvInvalid).Msg("Got invalid KVTransferParams; prefilling locally")
		return legLocal
	}
	switch {
	case g.p2p != nil && g.p2p.decoder != "" && s.cfg.canPrefillRemote():
		return legPrefill
	case g.p2p != nil && g.p2p.prefiller != nil && s.cfg.canDecodeRemote():
		return legDecode
	case g.p2p != nil && (g.p2p.decoder != "" || g.p2p.prefiller != nil):
		s.log.Warn().Str("request_id", rid).Str("role", string(s.cfg.Role)).Msg("p2p kv_transfer_params not servable by this role; serving locally")
	case g.kv != nil && g.kv.DoRemoteDecode && s.cfg.canPrefillRemote():
		return legPrefill
	case g.kv != nil && g.kv.DoRemotePrefill && s.cfg.canDecodeRemote():
		if why := g.kv.invalidForDecode(func() string { return s.shape.invalidDecode(g.kv, g.kvRaw) }); why != "" {
			s.m.invalidKVParams.Inc()
			s.log.Warn().Str("request_id", rid).Str("reason", why).Msg("Got invalid KVTransferParams; prefilling locally")
			return legLocal
		}
		return legDecode
	case g.kv != nil && (g.kv.DoRemoteDecode || g.kv.DoRemotePrefill):
		s.log.Warn().Str("request_id", rid).Str("role", string(s.cfg.Role)).Msg("kv_transfer_params not servable by this role; serving locally")
	case g.boot != nil && s.cfg.Role == RolePrefill:
		return legPrefill
	case g.boot != nil && s.cfg.Role == RoleDecode:
		return legDecode
	}
	return legLocal
}

// execute runs one admitted inference request and writes its answer. Every
// wait (the slow-prefill fault, the queue, the prefill, a KV pull, each
// decode step) ends when the client leaves, and the request then stops and
// frees what it holds; o.ended tells the caller whether the answer was
// finished (see countCancelled).
func (s *Sim) execute(ctx context.Context, w http.ResponseWriter, g *genRequest, leg legKind, a applied, o *output) {
	f := a.Faults
	start := time.Now()
	out := newSink(w, g.stream, f.DieAfterChunks)
	defer func() { o.ended = o.ended || out.ended }()
	s.m.waiting.Inc()
	if g.stream {
		out.start()
		if f.DieAfterHead {
			s.m.faultsInjected.WithLabelValues("die_after_head").Inc()
			s.m.waiting.Dec()
			out.ended = true // cut by the engine, not by the client
			panic(http.ErrAbortHandler)
		}
		if f.AfterHeadMS > 0 {
			s.m.faultsInjected.WithLabelValues("after_head").Inc()
			if !sleep(ctx, f.afterHead()) {
				s.m.waiting.Dec()
				return
			}
		}
	}
	if a.slowed {
		// A slow prefill: the request waits before it queues for a slot
		// and computes, as behind a long queue.
		s.m.faultsInjected.WithLabelValues("slow").Inc()
		s.log.Debug().Str("request_id", o.requestID).Dur("delay", a.slow).Msg("slow-prefill fault")
		if !sleep(ctx, a.slow) {
			s.m.waiting.Dec()
			return
		}
	}
	select {
	case s.slots <- struct{}{}:
		s.m.waiting.Dec()
	case <-ctx.Done():
		s.m.waiting.Dec()
		return
	}
	defer func() { <-s.slots }()
	s.m.running.Inc()
	defer s.m.running.Dec()
	nblocks := (len(g.prompt) + s.cfg.BlockSize - 1) / s.cfg.BlockSize
	s.holds.useActive(nblocks)
	defer s.holds.useActive(-nblocks)

	hashes := BlockHashes(g.prompt, s.cfg.BlockSize)
	if g.cacheHitThreshold > 0 && leg == legLocal {
		if hit := s.hitTokens(g, hashes); float64(hit) < g.cacheHitThreshold*float64(len(g.prompt)) {
			s.declineThreshold(out, g, o, hit)
			return
		}
	}
	kv, err := s.loadKV(ctx, g, leg, f, hashes, o.requestID)
	switch {
	case errors.Is(err, errKVLoadFailed):
		s.writeLoadFailure(out, o)
		return
	case err != nil:
		return // the client left
	}
	// A continued message's tokens are context too (continue.go).
	o.promptTokens, o.cachedTokens = len(g.prompt)+g.offset, kv.cached
	s.m.promptTokens.Add(float64(o.promptTokens))
	if g.continued {
		s.m.continuedMessages.Inc()
	}
	digest := Digest(kv.fps)

	maxTokens := g.maxTokens
	moriWrite := leg == legPrefill && g.isMoriIO()
	if moriWrite {
		// MoRI-IO write mode: the KV is written into the decode engine
		// before the first token goes out (moriio.go).
		if err := s.pushKV(ctx, g, f, hashes); err != nil {
			if ctx.Err() != nil {
				return // the client left
			}
			s.log.Error().Str("request_id", o.requestID).Err(err).Msg("MoRI-IO KV write failed")
			out.fail(http.StatusInternalServerError, errorBody(500, "InternalServerError", "", err.Error()))
			return
		}
		s.moriPrefillAnswer(g, o)
	}
	// held is the KV this request holds for a remote decoder until its
	// answer is written: a client that leaves before frees it at once.
	var held *hold
	p2pHold := leg == legPrefill && g.p2p != nil && g.p2p.decoder != ""
	if p2pHold {
		// The P2P tier holds the prefill's KV under the kv_request_id
		// before the first token, and the answer goes out as usual.
		h, err := s.holdKV(g, f, hashes, kv.recv, o)
		if err != nil {
			s.log.Error().Str("request_id", o.requestID).Err(err).Msg("cannot hold kv for a p2p pull")
			out.fail(http.StatusServiceUnavailable, errorBody(503, "ServiceUnavailableError", "", err.Error()))
			return
		}
		held = h
	}
	var room *hold // the KV of an SGLang room or Mooncake transfer
	if leg == legPrefill && (g.boot != nil || g.isMooncake()) {
		if g.boot != nil {
			// An SGLang prefill server generates the first token only.
			maxTokens = 1
		}
		if _, err := s.holdKV(g, f, hashes, kv.recv, o); err != nil {
			s.log.Error().Str("request_id", o.requestID).Err(err).Msg("cannot hold kv for a bootstrap room or transfer")
			out.fail(http.StatusServiceUnavailable, errorBody(503, "ServiceUnavailableError", "", err.Error()))
			return
		}
		room = s.holds.roomHold(roomKey(g))
	}
	// pin is the sequence a decode leg pins for the next turn's prefill
	// (bidirectional.go), made once the last token is known so that a
	// streamed answer's final chunk carries its kv_transfer_params.
	var pin *hold
	var onLast func()
	if s.pinsSequence(g, leg) {
		onLast = func() {
			if ctx.Err() == nil {
				pin = s.pinSequence(g, kv.recv, o)
			}
		}
	}
	if !s.generate(ctx, out, g, f, digest, maxTokens, o, start, onLast) || !s.awaitPull(ctx, room) {
		s.releaseCancelled(room)
		s.releaseCancelled(held)
		s.unpin(pin)
		return
	}
	if leg == legPrefill && room == nil && !p2pHold && !moriWrite && g.boot == nil && !g.isMooncake() && o.finish == "length" {
		if ctx.Err() != nil {
			return // the client left: hold nothing for it
		}
		h, err := s.holdKV(g, f, hashes, kv.recv, o)
		if err != nil {
			s.log.Error().Str("request_id", o.requestID).Err(err).Msg("cannot hold kv for remote decode")
			out.fail(http.StatusServiceUnavailable, errorBody(503, "ServiceUnavailableError", "", err.Error()))
			return
		}
		held = h
	}
	if ctx.Err() != nil {
		// The client left before its answer (and the kv_transfer_params
		// in it) was written: no decoder can learn of the KV, nor a
		// prefiller of a pin.
		s.releaseCancelled(held)
		s.unpin(pin)
		return
	}
	// Kept before the answer ends, as vLLM stores it before the client
	// reads response.completed (responses.go).
	s.keepResponse(g, leg, o)
	s.m.requestSuccess.WithLabelValues(o.finish).Inc()
	s.record(g, leg, kv, o.requestID, pin)
	s.m.e2e.Observe(time.Since(start).Seconds())
	if g.stream {
		if out.end(streamClose(o, g.includeUsage)...) != nil {
			s.releaseCancelled(held)
		}
		return
	}
	// Once written, the answer's hold stays until pulled or its lease ends,
	// as a vLLM prefill engine keeps KV for the decoder it told.
	out.json(http.StatusOK, responseJSON(o))
}

// generate produces the output tokens, streaming each one when the client
// asked for SSE. onLast, when set, is called once the last token and the
// finish reason are known, before that token goes out. It reports false
// when the client left.
func (s *Sim) generate(ctx context.Context, out *sink, g *genRequest, f Faults, d [32]byte, maxTokens int, o *output, start time.Time, onLast func()) bool {
	o.finish = "length"
	for i := 0; i < maxTokens; i++ {
		if i > 0 && !sleep(ctx, s.cfg.DecodePerToken) {
			return false
		}
		// Output position g.offset+i: a continued message resumes where
		// its content ends (continue.go).
		tok := GenerateToken(d, g.offset+i)
		eos := i == 0 && f.EOSFirstToken
		if eos {
			tok = EOSToken
			o.finish = "stop"
			s.m.faultsInjected.WithLabelValues("eos_first_token").Inc()
		}
		if !eos && f.EOSAfterTokens > 0 && g.offset+i == f.EOSAfterTokens {
			tok, eos = EOSToken, true
			o.finish = "stop"
			s.m.faultsInjected.WithLabelValues("eos_after_tokens").Inc()
		}
		o.tokens = append(o.tokens, tok)
		s.m.generationTokens.Inc()
		if i == 0 {
			s.m.ttft.Observe(time.Since(start).Seconds())
		}
		last := eos || i == maxTokens-1
		if last && onLast != nil {
			onLast()
		}
		if g.stream {
			var evs []sseEvent
			if i == 0 {
				evs = streamOpen(o)
			}
			fin := ""
			if last {
				fin = o.finish
			}
			if out.send(append(evs, streamToken(o, i, fin))...) != nil {
				return false
			}
		}
		if eos {
			break
		}
	}
	return ctx.Err() == nil
}

// kvLoaded is a request's KV once loaded or computed.
type kvLoaded struct {
	// fps are the fingerprints of the prompt's blocks.
	fps []uint64
	// recv are, by block, the bytes of blocks received from another
	// engine; a block without them (recv nil, or a nil entry) holds what
	// FillBlock makes of its hash. Holds and pins built from the request
	// carry the received bytes, so KV that came wrong stays wrong.
	recv [][]byte
	// cached is the number of prompt tokens to report as cached.
	cached int
	// history is the prompt tokens whose KV was pulled from a decode
	// engine's pinned sequence (bidirectional.go).
	history int
}

// loadKV fills the request's KV: pulled from the prefiller for a decode leg,
// computed locally otherwise (or after a failed pull under "recompute"),
// with a history pulled from a decode engine first for a prefill leg that
// names one (bidirectional.go).
func (s *Sim) loadKV(ctx context.Context, g *genRequest, leg legKind, f Faults, hashes []uint64, rid string) (kvLoaded, error) {
	if leg == legDecode && s.placeholderDecode(g) {
		s.m.placeholderDecodes.Inc()
		fps, _ := Fingerprints(g.prompt, s.cfg.BlockSize, s.cfg.KVBytesPerToken, hashes, func(int) (uint64, bool) { return 0, false })
		return kvLoaded{fps: fps, cached: len(g.prompt)}, nil
	}
	if leg == legDecode {
		fps, recv, err := s.pullKV(ctx, g, f, hashes, rid)
		if err == nil {
			s.m.remoteKVDecodes.Inc()
			s.countLayout(g)
			return kvLoaded{fps: fps, recv: recv, cached: len(g.prompt)}, nil
		}
		if ctx.Err() != nil {
			return kvLoaded{}, ctx.Err()
		}
		if g.p2pPrefiller() != nil {
			s.m.p2pPullFailures.WithLabelValues(p2pPrefill).Inc()
		} else {
			s.m.nixlFailed.Inc()
		}
		s.m.kvLoadFailures.WithLabelValues(s.cfg.KVLoadFailurePolicy).Inc()
		s.log.Error().Str("request_id", rid).Err(err).Str("policy", s.cfg.KVLoadFailurePolicy).Msg("KV load failed")
		if s.cfg.KVLoadFailurePolicy == PolicyFail {
			return kvLoaded{}, fmt.Errorf("%w: %w", errKVLoadFailed, err)
		}
	}
	if leg == legPrefill && s.cfg.BidirectionalKVXfer && g.hasHistory() {
		if kv, ok, err := s.prefillHistory(ctx, g, hashes, rid); ok || err != nil {
			return kv, err
		}
	}
	if g.p2p != nil && g.p2p.source != nil {
		s.pullSource(ctx, g, hashes, rid)
	}
	var kv kvLoaded
	var err error
	if s.store != nil {
		kv.fps, kv.cached, err = s.prefillShared(ctx, g, hashes)
	} else {
		kv.fps, kv.cached, err = s.prefillLocal(ctx, g, hashes)
	}
	return kv, err
}

// prefillLocal computes the KV on this engine, reusing cached prefix blocks
// and paying PrefillPerToken for every other prompt token.
func (s *Sim) prefillLocal(ctx context.Context, g *genRequest, hashes []uint64) ([]uint64, int, error) {
	bs := s.cfg.BlockSize
	fps, hits := Fingerprints(g.prompt, bs, s.cfg.KVBytesPerToken, hashes, func(j int) (uint64, bool) {
		return s.cache.get(hashes[j])
	})
	cached := hits * bs
	s.m.prefixQueries.Add(float64(len(g.prompt)))
	s.m.prefixHits.Add(float64(cached))
	s.m.localPrefillTokens.Add(float64(len(g.prompt)))
	s.m.prefillComputedTokens.Add(float64(len(g.prompt) - cached))
	if !s.computePrefill(ctx, time.Duration(len(g.prompt)-cached)*s.cfg.PrefillPerToken) {
		return nil, 0, ctx.Err()
	}
	for j := hits; j < len(hashes); j++ {
		if BlockTokens(len(g.prompt), bs, j) == bs {
			s.cache.put(hashes[j], fps[j])
		}
	}
	return fps, cached, nil
}

// computePrefill spends d computing a prefill. With --prefill-slots, the
// computation first waits for a free prefill slot, as prefills share a real
// engine's compute: meanwhile the request counts as waiting, not running.
// It reports false when the client left.
func (s *Sim) computePrefill(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	if s.prefillSlots == nil {
		s.m.prefillsComputed.Inc()
		return sleep(ctx, d)
	}
	select {
	case s.prefillSlots <- struct{}{}:
	default:
		s.m.running.Dec()
		s.m.waiting.Inc()
		select {
		case s.prefillSlots <- struct{}{}:
		case <-ctx.Done():
		}
		s.m.waiting.Dec()
		s.m.running.Inc()
		if ctx.Err() != nil {
			return false
		}
	}
	defer func() { <-s.prefillSlots }()
	s.m.prefillsComputed.Inc()
	return sleep(ctx, d)
}

// pullKV pulls the request's KV from its prefiller and checks it covers the
// prompt. It returns the fingerprints of the pulled bytes and, when they
// came over a side channel, the bytes (nil otherwise).
func (s *Sim) pullKV(ctx context.Context, g *genRequest, f Faults, hashes []uint64, rid string) ([]uint64, [][]byte, error) {
	if f.FailKVLoad {
		s.m.faultsInjected.WithLabelValues("fail_kv_load").Inc()
		return nil, nil, fmt.Errorf("%w: injected fault fail_kv_load", ErrKVPull)
	}
	if g.kv != nil && g.kv.Preloaded != nil {
		if s.kva == nil {
			return nil, nil, fmt.Errorf("%w: kv_preloaded but this engine has no kv region (--kv-agent-transport)", ErrKVPull)
		}
		fps, err := s.kva.loadPreloaded(g.kv.Preloaded, len(g.prompt), len(hashes))
		return fps, nil, err
	}
	if g.isMoriIO() {
		fps, err := s.useMoriKV(ctx, g, hashes) // MoRI-IO write mode (moriio.go)
		return fps, nil, err
	}
	var addr string
	var req pullRequest
	if g.isMooncake() {
		var err error
		if addr, req, err = s.mooncakePull(ctx, g); err != nil {
			return nil, nil, err
		}
	} else if pp := g.p2pPrefiller(); pp != nil {
		addr, req = s.p2pPrefillPull(pp)
	} else if g.boot != nil {
		// SGLang's decode joins f"{bootstrap_host}:{bootstrap_port}": an
		// IPv6 host must come bracketed (SGLang's mini_lb brackets it).
		addr = g.boot.host + ":" + strconv.Itoa(g.boot.port)
		room := g.boot.room
		req = pullRequest{Room: &room, WaitMS: int(s.cfg.BootstrapTimeout / time.Millisecond)}
	} else {
		// NIXL: the first pull from a prefiller engine waits for the
		// handshake with it (handshake.go).
		if err := s.hs.connect(ctx, *g.kv.RemoteEngineID); err != nil {
			return nil, nil, err
		}
		ids, _ := g.kv.blockIDs()
		addr = net.JoinHostPort(*g.kv.RemoteHost, strconv.Itoa(*g.kv.RemotePort))
		held := rid // the oldest generation: the request's own id
		if g.kv.RemoteRequestID != nil {
			held = *g.kv.RemoteRequestID
		}
		req = pullRequest{EngineID: *g.kv.RemoteEngineID, RequestID: held, BlockIDs: ids}
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.BootstrapTimeout+5*time.Second)
	defer cancel()
	start := time.Now()
	p, err := pull(pctx, addr, req, s.cfg.KVBandwidth, s.cfg.KVVerifyChecksums)
	if err != nil {
		return nil, nil, err
	}
	if p.numTokens != len(g.prompt) || len(p.blocks) != len(hashes) {
		return nil, nil, fmt.Errorf("%w: pulled %d tokens in %d blocks, prompt has %d tokens in %d blocks",
			ErrKVPull, p.numTokens, len(p.blocks), len(g.prompt), len(hashes))
	}
	if g.p2pPrefiller() != nil {
		s.m.p2pPulls.WithLabelValues(p2pPrefill).Inc()
		s.m.p2pBlocksPulled.WithLabelValues(p2pPrefill).Add(float64(len(p.blocks)))
	} else {
		s.m.nixlXferTime.Observe(time.Since(start).Seconds())
		s.m.nixlBytes.Observe(float64(p.bytes))
	}
	if g.isMooncake() {
		s.m.mooncakeDecodes.Inc()
	} else if g.boot != nil {
		s.m.bootstrapDecodes.Inc()
	}
	fps := make([]uint64, len(p.blocks))
	for i, b := range p.blocks {
		fps[i] = Fingerprint(b)
	}
	return fps, p.blocks, nil
}

// holdKV materialises the request's blocks and holds them for a remote
// decoder, setting the answer's kv_transfer_params (NIXL). A block received
// from another engine (recv, see kvLoaded) is held as received. It returns
// the hold.
func (s *Sim) holdKV(g *genRequest, f Faults, hashes []uint64, recv [][]byte, o *output) (*hold, error) {
	bb := s.blockBytes()
	heldID := o.requestID + "-" + randomHex(8) // newer vLLM: its own id, answered
	if !s.shape.has("remote_request_id") {
		heldID = o.requestID // the oldest generation: the decode leg's id is the same
	}
	h := &hold{requestID: heldID, tokens: len(g.prompt), corrupt: f.CorruptKV, done: make(chan struct{})}
	if g.p2p != nil && g.p2p.decoder != "" {
		h.room, h.hasRoom, h.p2p = p2pKey(g.p2p.decoder), true, p2pPrefill
	} else if g.boot != nil {
		h.room, h.hasRoom = g.boot.room, true
	} else if g.isMooncake() {
		g.mooncakeEngine = s.mooncakeRank(g.dpRank)
		h.room, h.hasRoom, h.transferID = mooncakeKey(g.mooncakeEngine, *g.kv.TransferID), true, *g.kv.TransferID
	}
	for j, hash := range hashes {
		var blk []byte
		if j < len(recv) && recv[j] != nil {
			blk = recv[j]
		} else {
			blk = make([]byte, bb)
			FillBlock(blk, hash, BlockTokens(len(g.prompt), s.cfg.BlockSize, j)*s.cfg.KVBytesPerToken)
		}
		h.blocks = append(h.blocks, blk)
		h.checksums = append(h.checksums, Fingerprint(blk))
	}
	lease := s.cfg.KVLease
	if f.ExpireKV {
		lease = 0
		s.m.faultsInjected.WithLabelValues("expire_kv").Inc()
	}
	if f.CorruptKV {
		s.m.faultsInjected.WithLabelValues("corrupt_kv").Inc()
	}
	if err := s.holds.add(h, lease); err != nil {
		return nil, err
	}
	s.m.remoteDecodePrefills.Inc()
	if h.p2p != "" {
		s.m.p2pHolds.Inc()
		return h, nil
	}
	if h.transferID != "" {
		s.m.mooncakePrefills.Inc()
		return h, nil
	}
	if h.hasRoom {
		s.m.bootstrapPrefills.Inc()
		return h, nil
	}
	kv := s.KVAddr()
	host := kv.IP.String()
	if kv.IP.IsUnspecified() && o.localHost != "" {
		host = o.localHost
	}
	o.kv = s.shape.params(prefillValues{
		engineID: s.engineID, requestID: h.requestID, host: host, port: kv.Port,
		tokens: len(g.prompt), cached: o.cachedTokens, blockIDs: h.blockIDs,
		tp: s.cfg.TPSize, dcp: s.cfg.DCPSize, pp: s.cfg.PPSize,
	})
	if g.kv != nil && g.kv.PullMode == PullModeSidecar && s.kva != nil {
		if err := s.kva.export(h, lease, o); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// writeLoadFailure answers a KV load failure under the "fail" policy the way
// vLLM does: HTTP 500 for JSON; for SSE, the opening events (the role chunk
// for chat) and then an error event and [DONE].
func (s *Sim) writeLoadFailure(out *sink, o *output) {
	if !out.stream {
		out.json(http.StatusInternalServerError, internalErrorBody())
		return
	}
	_ = out.end(append(streamOpen(o), streamError()...)...)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
