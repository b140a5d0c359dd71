package enginesim

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
	"time"
)

// vLLM OffloadingConnector's P2P tier, the engine side. Every engine listens
// on its P2P port (--p2p-port) and serves two kinds of pull there, on the KV
// side channel's protocol (one JSON request line, one JSON header line, the
// block bytes, "done"):
//
//   - "prefill": a prefill with kv_transfer_params.remote_decoder holds its
//     prompt's blocks under the kv_request_id; the decoder, whose request
//     carries remote_prefiller, connects (concurrently with the prefill) and
//     the server waits for the hold, then streams every block; the pull
//     releases them.
//   - "source": a request with remote_kv_source sends the chained hashes of
//     its prompt's full blocks it lacks; the source answers with the leading
//     run of them its own prefix cache holds, bytes regenerated from the
//     hash. The puller takes them as prefix-cache hits.

// The kinds of P2P pull, also the kind label of the p2p metrics.
const (
	p2pPrefill = "prefill"
	p2pSource  = "source"
)

// p2pPeer is a remote_prefiller or remote_kv_source sub-dict.
type p2pPeer struct {
	requestID string
	host      string
	port      int
}

func (p *p2pPeer) addr() string { return net.JoinHostPort(p.host, strconv.Itoa(p.port)) }

// p2pParams are the P2P sub-dicts of kv_transfer_params.
type p2pParams struct {
	// decoder is remote_decoder.kv_request_id ("" when absent).
	decoder   string
	prefiller *p2pPeer
	source    *p2pPeer
}

// p2pPrefiller returns the request's remote_prefiller (nil when none).
func (g *genRequest) p2pPrefiller() *p2pPeer {
	if g.p2p == nil {
		return nil
	}
	return g.p2p.prefiller
}

// p2pKey maps a kv_request_id onto the hold store's room keys.
func p2pKey(kvRequestID string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("p2p:"))
	_, _ = h.Write([]byte(kvRequestID))
	return h.Sum64()
}

// parseP2P reads the P2P sub-dicts of kv_transfer_params (raw, an object or
// not); kv is the rest of the params (nil when unusable). Malformed
// sub-dicts and contradictory combinations are client errors.
func parseP2P(raw json.RawMessage, kv *kvParams) (*p2pParams, error) {
	var top map[string]json.RawMessage
	if json.Unmarshal(raw, &top) != nil {
		return nil, nil // not an object: kvInvalid says so
	}
	var p p2pParams
	if r := top["remote_decoder"]; !absent(r) {
		m, err := subDict(r, "remote_decoder")
		if err != nil {
			return nil, err
		}
		if p.decoder, err = requiredString(m, "remote_decoder", "kv_request_id"); err != nil {
			return nil, err
		}
	}
	var err error
	if p.prefiller, err = parsePeer(top["remote_prefiller"], "remote_prefiller"); err != nil {
		return nil, err
	}
	if p.source, err = parsePeer(top["remote_kv_source"], "remote_kv_source"); err != nil {
		return nil, err
	}
	switch {
	case p.decoder == "" && p.prefiller == nil && p.source == nil:
		return nil, nil
	case p.decoder != "" && p.prefiller != nil:
		return nil, badRequest("kv_transfer_params", "kv_transfer_params: remote_decoder and remote_prefiller exclude each other")
	case p.decoder != "" && kv != nil && kv.DoRemoteDecode:
		return nil, badRequest("kv_transfer_params", "kv_transfer_params: remote_decoder and do_remote_decode exclude each other")
	case p.prefiller != nil && kv != nil && kv.DoRemotePrefill:
		return nil, badRequest("kv_transfer_params", "kv_transfer_params: remote_prefiller and do_remote_prefill exclude each other")
	}
	return &p, nil
}

func subDict(raw json.RawMessage, name string) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, badRequest("kv_transfer_params."+name, "kv_transfer_params.%s must be an object", name)
	}
	return m, nil
}

func requiredString(m map[string]json.RawMessage, dict, key string) (string, error) {
	name := "kv_transfer_params." + dict + "." + key
	v, _, err := optString(m[key], name)
	if err != nil {
		return "", err
	}
	if v == "" {
		return "", badRequest(name, "%s is required", name)
	}
	return v, nil
}

// parsePeer reads a sub-dict naming a P2P peer: kv_request_id, remote_host
// and remote_port (1..65535). Absent or null is nil.
func parsePeer(raw json.RawMessage, name string) (*p2pPeer, error) {
	if absent(raw) {
		return nil, nil
	}
	m, err := subDict(raw, name)
	if err != nil {
		return nil, err
	}
	var p p2pPeer
	if p.requestID, err = requiredString(m, name, "kv_request_id"); err != nil {
		return nil, err
	}
	if p.host, err = requiredString(m, name, "remote_host"); err != nil {
		return nil, err
	}
	portName := "kv_transfer_params." + name + ".remote_port"
	port, ok, err := optInt(m["remote_port"], portName)
	if err != nil {
		return nil, err
	}
	if !ok || port < 1 || port > 65535 {
		return nil, badRequest(portName, "%s must be a port within 1..65535", portName)
	}
	p.port = port
	return &p, nil
}

// serveP2P accepts P2P pulls on l until ctx ends.
func (s *Sim) serveP2P(ctx context.Context, l net.Listener) error {
	return acceptEach(ctx, l, "p2p listener", func(c net.Conn) { s.serveBlocks(ctx, c, s.findP2P) })
}

// findP2P resolves a P2P pull: a prefill's hold (waited for), or the
// leading blocks of a source's prefix cache.
func (s *Sim) findP2P(ctx context.Context, req pullRequest) (*hold, error) {
	if req.KVRequestID == "" {
		return nil, fmt.Errorf("p2p pull without kv_request_id: %w", ErrNoSuchTransfer)
	}
	switch req.Kind {
	case p2pPrefill:
		return s.waitHold(ctx, p2pKey(req.KVRequestID), req.WaitMS)
	case p2pSource:
		return s.sourceBlocks(req), nil
	}
	return nil, fmt.Errorf("p2p pull of unknown kind %q: %w", req.Kind, ErrNoSuchTransfer)
}

// sourceBlocks materialises the leading run of req.Hashes this engine's
// prefix cache holds, as a hold that is served but not stored.
func (s *Sim) sourceBlocks(req pullRequest) *hold {
	bb := s.blockBytes()
	h := &hold{requestID: req.KVRequestID, p2p: p2pSource}
	for i, hash := range req.Hashes {
		if _, ok := s.cache.get(hash); !ok {
			break
		}
		blk := make([]byte, bb)
		FillBlock(blk, hash, bb)
		h.blocks = append(h.blocks, blk)
		h.checksums = append(h.checksums, Fingerprint(blk))
		h.blockIDs = append(h.blockIDs, i)
	}
	h.tokens = len(h.blocks) * s.cfg.BlockSize
	return h
}

// p2pPrefillPull is the pull of a decode leg whose request names a
// remote_prefiller: the prefiller waits up to this engine's bootstrap
// timeout for the prefill to hold its KV.
func (s *Sim) p2pPrefillPull(pp *p2pPeer) (string, pullRequest) {
	return pp.addr(), pullRequest{Kind: p2pPrefill, KVRequestID: pp.requestID, WaitMS: int(s.cfg.BootstrapTimeout / time.Millisecond)}
}

// pullSource pulls from the request's remote_kv_source the leading full
// blocks past this engine's own prefix-cache hits that the source has, and
// puts them in the prefix cache, so the prefill that follows takes them as
// cached (no prefill cost, counted in cached_tokens) while its output still
// derives from the pulled bytes. A source is only an optimisation: a
// failure is counted and logged, and the prefill computes what is missing.
func (s *Sim) pullSource(ctx context.Context, g *genRequest, hashes []uint64, rid string) {
	src := g.p2p.source
	bs := s.cfg.BlockSize
	full := len(g.prompt) / bs
	from := 0
	for from < full {
		if _, ok := s.cache.get(hashes[from]); !ok {
			break
		}
		from++
	}
	if from == full {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.BootstrapTimeout)
	defer cancel()
	req := pullRequest{Kind: p2pSource, KVRequestID: src.requestID, Hashes: hashes[from:full]}
	p, err := pull(pctx, src.addr(), req, s.cfg.KVBandwidth, s.cfg.KVVerifyChecksums)
	if err == nil && (len(p.blocks) > full-from || p.numTokens != len(p.blocks)*bs) {
		err = fmt.Errorf("%w: source sent %d blocks of %d tokens for %d asked", ErrKVPull, len(p.blocks), p.numTokens, full-from)
	}
	if err != nil {
		s.m.p2pPullFailures.WithLabelValues(p2pSource).Inc()
		s.log.Warn().Str("request_id", rid).Str("source", src.addr()).Err(err).Msg("p2p pull from the kv source failed; prefilling locally")
		return
	}
	s.m.p2pPulls.WithLabelValues(p2pSource).Inc()
	s.m.p2pBlocksPulled.WithLabelValues(p2pSource).Add(float64(len(p.blocks)))
	for i, b := range p.blocks {
		s.cache.put(hashes[from+i], Fingerprint(b))
	}
	s.log.Debug().Str("request_id", rid).Str("source", src.addr()).Int("blocks", len(p.blocks)).Msg("p2p pulled prefix blocks from the kv source")
}
