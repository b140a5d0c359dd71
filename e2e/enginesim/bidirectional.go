package enginesim

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Bidirectional KV transfer, vLLM NixlConnector's bidirectional_kv_xfer
// (multi-turn KV reuse), on --bidirectional-kv-xfer:
//
//   - A decode leg (a completions or chat request whose kv_transfer_params
//     have do_remote_prefill) that finishes with "stop" or "length" pins its
//     sequence for --decoder-kv-blocks-ttl, a fixed deadline, and its answer
//     carries kv_transfer_params naming the pin: do_remote_decode true,
//     remote_engine_id, remote_request_id, remote_block_ids, remote_host and
//     remote_port (this engine's KV side channel), tp_size, dcp_size, pp_size,
//     remote_num_tokens, remote_blocks_expiry_time (seconds on this
//     engine's monotonic clock, whose origin is the engine's start) and
//     transfer_mode "pull". A streamed answer carries them in the chunk with
//     the finish_reason. The pin counts among the held blocks.
//   - The pinned sequence is the one the next turn's prompt tokenizes the
//     history as: the prompt's tokens followed by Tokenize of the whole
//     output's text (reasoning, then content). The simulator's KV of a
//     generated token is that of the token its text reads back as, so that a
//     turn that carries the answer back verbatim extends the engine's
//     sequence exactly, as a real model's tokenizer round trip does. Its
//     blocks are those BlockHashes chains over the sequence, filled by
//     FillBlock like any block, so a full block's bytes equal what a prefill
//     of the same tokens computes; a full prompt block whose KV this engine
//     received from its prefiller is pinned as received.
//   - A prefill leg (do_remote_decode) whose kv_transfer_params name such a
//     pin (remote_request_id and remote_block_ids, with remote_engine_id,
//     remote_host, remote_port and remote_num_tokens) pulls the history:
//     remote block i holds tokens [i*bs, (i+1)*bs), and nothing compares
//     token contents, so a history that is not the prompt's prefix gives
//     wrong KV, silently, as in vLLM. The first min(remote_num_tokens,
//     prompt-1)/bs full blocks are the history; the leading ones in this
//     engine's prefix cache are not pulled; when fewer than
//     --kv-recompute-threshold tokens are left to pull, none are and the
//     prefill recomputes them. Otherwise the pulled blocks' bytes are this
//     request's KV for those blocks (their fingerprints seed the output,
//     and the hold for the decoder carries them), and only the rest of the
//     prompt costs prefill time. Either way the decode engine frees the
//     pin: the history pull's "done" frees it, and a prefill that pulls
//     nothing makes a pull of no blocks, which only frees it.
//   - A history pull that fails (pin expired or unknown, decode engine
//     unreachable) follows --kv-load-failure-policy: "fail" answers as a
//     failed KV load does (HTTP 500 for JSON), "recompute" computes the
//     whole prompt here.
//
// An engine without --bidirectional-kv-xfer pins nothing and ignores a
// prefill leg's history, prefilling the whole prompt, as a vLLM NixlConnector
// without the option does. A prefill that pulled a history does not use the
// shared storage (--shared-storage-dir).

// hasHistory reports whether a prefill leg's kv_transfer_params name a
// decode engine's pinned sequence.
func (g *genRequest) hasHistory() bool {
	p := g.kv
	return p != nil && p.DoRemoteDecode && p.TransferID == nil &&
		p.RemoteRequestID != nil && *p.RemoteRequestID != "" && !absent(p.RemoteBlockIDs)
}

// invalidForHistory reports why p cannot name a pull of a pinned history,
// or "" when it can.
func (p *kvParams) invalidForHistory() string {
	var missing []string
	if p.RemoteEngineID == nil || *p.RemoteEngineID == "" {
		missing = append(missing, "remote_engine_id")
	}
	if p.RemoteHost == nil || *p.RemoteHost == "" {
		missing = append(missing, "remote_host")
	}
	if p.RemotePort == nil || *p.RemotePort <= 0 || *p.RemotePort > 65535 {
		missing = append(missing, "remote_port")
	}
	if p.RemoteNumTokens == nil || *p.RemoteNumTokens < 0 {
		missing = append(missing, "remote_num_tokens")
	}
	if len(missing) > 0 {
		return "history: missing or invalid " + strings.Join(missing, ", ")
	}
	if _, err := p.blockIDs(); err != nil {
		return "history: " + err.Error()
	}
	return ""
}

// historyPull is the side-channel address and request of a pull of the
// pinned blocks ids of the history p names (none: only free the pin).
func historyPull(p *kvParams, ids []int) (string, pullRequest) {
	return net.JoinHostPort(*p.RemoteHost, strconv.Itoa(*p.RemotePort)),
		pullRequest{EngineID: *p.RemoteEngineID, RequestID: *p.RemoteRequestID, BlockIDs: ids, History: true}
}

// pinsSequence reports whether a request, once finished, pins its sequence.
func (s *Sim) pinsSequence(g *genRequest, leg legKind) bool {
	return s.cfg.BidirectionalKVXfer && leg == legDecode && g.kv != nil && g.kv.DoRemotePrefill &&
		(g.api == apiCompletions || g.api == apiChat) && !g.isMooncake() && !g.isMoriIO()
}

// pinSequence pins a finished decode leg's sequence and sets the answer's
// kv_transfer_params to name it; recv are the prompt blocks this engine
// received (see kvLoaded). It returns the pin, or nil when nothing was
// pinned (an aborted request, no KV side channel, no free blocks).
func (s *Sim) pinSequence(g *genRequest, recv [][]byte, o *output) *hold {
	if o.finish != "stop" && o.finish != "length" {
		return nil
	}
	kvAddr := s.KVAddr()
	if kvAddr == nil {
		return nil
	}
	bs, bpt := s.cfg.BlockSize, s.cfg.KVBytesPerToken
	seq := append(slices.Clone(g.prompt), Tokenize(o.text())...)
	full := len(g.prompt) / bs
	h := &hold{requestID: o.requestID + "-" + randomHex(8), tokens: len(seq), pinned: true}
	for j, hash := range BlockHashes(seq, bs) {
		var blk []byte
		if j < full && j < len(recv) && recv[j] != nil {
			blk = recv[j]
		} else {
			blk = make([]byte, s.blockBytes())
			FillBlock(blk, hash, BlockTokens(len(seq), bs, j)*bpt)
		}
		h.blocks = append(h.blocks, blk)
		h.checksums = append(h.checksums, Fingerprint(blk))
	}
	ttl := s.cfg.DecoderKVBlocksTTL
	expiry := (time.Since(s.clock0) + ttl).Seconds()
	if err := s.holds.add(h, ttl); err != nil {
		s.log.Warn().Str("request_id", o.requestID).Err(err).Msg("cannot pin the sequence for the next turn")
		return nil
	}
	s.m.bidiPins.Inc()
	host := kvAddr.IP.String()
	if kvAddr.IP.IsUnspecified() && o.localHost != "" {
		host = o.localHost
	}
	o.kv = map[string]any{
		"do_remote_prefill":         false,
		"do_remote_decode":          true,
		"remote_block_ids":          [][]int{h.blockIDs},
		"remote_engine_id":          s.engineID,
		"remote_request_id":         h.requestID,
		"remote_host":               host,
		"remote_port":               kvAddr.Port,
		"tp_size":                   s.cfg.TPSize,
		"dcp_size":                  s.cfg.DCPSize,
		"pp_size":                   s.cfg.PPSize,
		"remote_num_tokens":         len(seq) - 1,
		"remote_blocks_expiry_time": expiry,
		"transfer_mode":             "pull",
	}
	s.log.Debug().Str("request_id", o.requestID).Str("pin", h.requestID).Int("tokens", len(seq)).
		Int("blocks", len(h.blocks)).Msg("sequence pinned for the next turn")
	return h
}

// unpin frees the pin of a request whose client left before its answer
// named the pin (nil: none).
func (s *Sim) unpin(h *hold) {
	if h != nil && s.holds.release(h) {
		s.log.Debug().Str("request_id", h.requestID).Msg("answer not delivered; pinned sequence freed")
	}
}

// pinView resolves a side-channel pull of held blocks h when either is a
// history's: a history pull reads a pin, and only a history pull does. It
// returns a view of the blocks asked, in the order asked; the pull that
// reads it frees the whole pin.
func pinView(h *hold, req pullRequest, blockSize int) (*hold, error) {
	switch {
	case req.History && !h.pinned:
		return nil, fmt.Errorf("request %q is not a pinned sequence: %w", req.RequestID, ErrNoSuchTransfer)
	case !req.History:
		return nil, fmt.Errorf("request %q is a pinned sequence, read by history pulls only: %w", req.RequestID, ErrNoSuchTransfer)
	}
	at := make(map[int]int, len(h.blockIDs))
	for i, id := range h.blockIDs {
		at[id] = i
	}
	v := &hold{requestID: h.requestID, blockIDs: req.BlockIDs, of: h}
	for _, id := range req.BlockIDs {
		i, ok := at[id]
		if !ok {
			return nil, fmt.Errorf("request %q: block %d is not pinned: %w", req.RequestID, id, ErrNoSuchTransfer)
		}
		v.blocks = append(v.blocks, h.blocks[i])
		v.checksums = append(v.checksums, h.checksums[i])
		v.tokens += BlockTokens(h.tokens, blockSize, i)
	}
	return v, nil
}

// prefillHistory computes a prefill leg's KV with the history its
// kv_transfer_params name. It reports false, with no error, when the
// prefill is to proceed as usual: the params are unusable, nothing is
// pulled (all cached, or below the threshold), or the pull failed under
// the "recompute" policy. The error is errKVLoadFailed's under "fail", or
// ctx's when the client left.
func (s *Sim) prefillHistory(ctx context.Context, g *genRequest, hashes []uint64, rid string) (kvLoaded, bool, error) {
	if why := g.kv.invalidForHistory(); why != "" {
		s.m.invalidKVParams.Inc()
		s.log.Warn().Str("request_id", rid).Str("reason", why).Msg("Got invalid KVTransferParams; prefilling locally")
		return kvLoaded{}, false, nil
	}
	bs, n := s.cfg.BlockSize, len(g.prompt)
	ids, _ := g.kv.blockIDs()
	hb := min(min(*g.kv.RemoteNumTokens, n-1)/bs, len(ids))
	fps := make([]uint64, len(hashes))
	hits := 0
	for ; hits < hb; hits++ {
		fp, ok := s.cache.get(hashes[hits])
		if !ok {
			break
		}
		fps[hits] = fp
	}
	if want := (hb - hits) * bs; want == 0 || want < s.cfg.KVRecomputeThreshold {
		if want > 0 {
			s.m.bidiRecomputed.Inc()
			s.log.Debug().Str("request_id", rid).Int("tokens", want).Int("threshold", s.cfg.KVRecomputeThreshold).
				Msg("history below kv_recompute_threshold; recomputing it")
		}
		s.freePin(g.kv, rid)
		return kvLoaded{}, false, nil
	}
	recv, err := s.pullHistory(ctx, g.kv, ids[hits:hb])
	if err != nil {
		if ctx.Err() != nil {
			return kvLoaded{}, false, ctx.Err()
		}
		s.m.bidiHistoryFailures.Inc()
		s.log.Error().Str("request_id", rid).Err(err).Str("policy", s.cfg.KVLoadFailurePolicy).Msg("history KV pull failed")
		if s.cfg.KVLoadFailurePolicy == PolicyFail {
			return kvLoaded{}, false, fmt.Errorf("%w: %w", errKVLoadFailed, err)
		}
		return kvLoaded{}, false, nil
	}
	kv := kvLoaded{fps: fps, recv: make([][]byte, len(hashes)), cached: hb * bs, history: len(recv) * bs}
	for i, blk := range recv {
		kv.recv[hits+i] = blk
		kv.fps[hits+i] = Fingerprint(blk)
	}
	buf := make([]byte, s.blockBytes())
	for j := hb; j < len(hashes); j++ {
		FillBlock(buf, hashes[j], BlockTokens(n, bs, j)*s.cfg.KVBytesPerToken)
		kv.fps[j] = Fingerprint(buf)
	}
	s.m.prefixQueries.Add(float64(n))
	s.m.prefixHits.Add(float64(hits * bs))
	s.m.localPrefillTokens.Add(float64(n - (hb-hits)*bs))
	s.m.prefillComputedTokens.Add(float64(n - hb*bs))
	if !s.computePrefill(ctx, time.Duration(n-hb*bs)*s.cfg.PrefillPerToken) {
		return kvLoaded{}, false, ctx.Err()
	}
	// The prefix cache keeps fingerprints and regenerates bytes from
	// hashes, so a pulled block enters it only when its bytes are those
	// its tokens compute to.
	for j := hits; j < len(hashes); j++ {
		if BlockTokens(n, bs, j) != bs {
			continue
		}
		if j < hb {
			FillBlock(buf, hashes[j], bs*s.cfg.KVBytesPerToken)
			if Fingerprint(buf) != kv.fps[j] {
				continue
			}
		}
		s.cache.put(hashes[j], kv.fps[j])
	}
	s.log.Debug().Str("request_id", rid).Int("cached_blocks", hits).Int("pulled_blocks", len(recv)).
		Int("computed_tokens", n-hb*bs).Msg("history pulled from the decode engine")
	return kv, true, nil
}

// pullHistory pulls the pinned blocks ids of the history p names. It
// returns their bytes, in order.
func (s *Sim) pullHistory(ctx context.Context, p *kvParams, ids []int) ([][]byte, error) {
	// The first pull from a decode engine waits for the NIXL handshake
	// with it, as a decode's first pull from a prefiller does.
	if err := s.hs.connect(ctx, *p.RemoteEngineID); err != nil {
		return nil, err
	}
	addr, req := historyPull(p, ids)
	pctx, cancel := context.WithTimeout(ctx, s.cfg.BootstrapTimeout+5*time.Second)
	defer cancel()
	start := time.Now()
	got, err := pull(pctx, addr, req, s.cfg.KVBandwidth, s.cfg.KVVerifyChecksums)
	if err != nil {
		return nil, err
	}
	bs := s.cfg.BlockSize
	if len(got.blocks) != len(ids) || got.numTokens != len(ids)*bs || (len(got.blocks) > 0 && len(got.blocks[0]) != s.blockBytes()) {
		return nil, fmt.Errorf("%w: decode engine sent %d blocks (%d bytes) of %d tokens for %d full blocks of %d bytes",
			ErrKVPull, len(got.blocks), got.bytes, got.numTokens, len(ids), s.blockBytes())
	}
	s.m.nixlXferTime.Observe(time.Since(start).Seconds())
	s.m.nixlBytes.Observe(float64(got.bytes))
	s.m.bidiHistoryPulls.Inc()
	s.m.bidiHistoryBlocks.Add(float64(len(got.blocks)))
	return got.blocks, nil
}

// freePin tells the decode engine that pinned the history p names to free
// it, in the background: a pull of no blocks. A pin that is gone already is
// no error; a decode engine that cannot be reached frees it at its TTL.
func (s *Sim) freePin(p *kvParams, rid string) {
	addr, req := historyPull(p, nil)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.BootstrapTimeout)
		defer cancel()
		if _, err := pull(ctx, addr, req, 0, false); err != nil {
			s.log.Debug().Str("request_id", rid).Str("decode_engine", addr).Err(err).Msg("could not free the pinned history")
		}
	}()
}
