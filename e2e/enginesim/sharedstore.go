package enginesim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// The shared-storage (LMCache-style) model. With --shared-storage-dir, every
// block this engine computes is written to the directory, one file per
// block named by its chained hash, and every prefill first loads what it can
// from there (after its own prefix cache), so a decode engine sharing the
// directory with a prefill engine reads the prefill's KV. A request with
// cache_hit_threshold whose hit ratio (prefix cache plus store, in prompt
// tokens) is below it is declined with finish_reason "cache_threshold" and
// no output.

// finishCacheThreshold is the finish reason of a declined request.
const finishCacheThreshold = "cache_threshold"

// sharedStore is a directory of KV blocks.
type sharedStore struct {
	dir string
}

func newSharedStore(dir string) (*sharedStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("shared storage: %w", err)
	}
	return &sharedStore{dir: dir}, nil
}

func (st *sharedStore) path(hash uint64) string {
	return filepath.Join(st.dir, strconv.FormatUint(hash, 16)+".kv")
}

// has reports whether the block is stored.
func (st *sharedStore) has(hash uint64) bool {
	_, err := os.Stat(st.path(hash))
	return err == nil
}

// load reads a stored block of size bytes.
func (st *sharedStore) load(hash uint64, size int) ([]byte, error) {
	b, err := os.ReadFile(st.path(hash))
	if err != nil {
		return nil, err
	}
	if len(b) != size {
		return nil, fmt.Errorf("block %x: %d bytes, want %d", hash, len(b), size)
	}
	return b, nil
}

// save writes a block atomically (a reader never sees half a block).
func (st *sharedStore) save(hash uint64, blk []byte) error {
	f, err := os.CreateTemp(st.dir, ".tmp-*")
	if err != nil {
		return err
	}
	_, werr := f.Write(blk)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write block %x: %v %v", hash, werr, cerr)
	}
	return os.Rename(f.Name(), st.path(hash))
}

// hitTokens counts the prompt tokens this engine would not compute: leading
// full blocks in its prefix cache, then blocks in the shared store.
func (s *Sim) hitTokens(g *genRequest, hashes []uint64) int {
	bs, n := s.cfg.BlockSize, len(g.prompt)
	j, hit := 0, 0
	for ; j < len(hashes) && BlockTokens(n, bs, j) == bs; j++ {
		if _, ok := s.cache.get(hashes[j]); !ok {
			break
		}
		hit += bs
	}
	for ; s.store != nil && j < len(hashes) && s.store.has(hashes[j]); j++ {
		hit += BlockTokens(n, bs, j)
	}
	return hit
}

// prefillShared computes the KV like prefillLocal, loading what it can from
// the shared store and writing what it computed to it.
func (s *Sim) prefillShared(ctx context.Context, g *genRequest, hashes []uint64) ([]uint64, int, error) {
	bs, n, bb := s.cfg.BlockSize, len(g.prompt), s.blockBytes()
	fps := make([]uint64, len(hashes))
	j, hits := 0, 0
	for ; j < len(hashes) && BlockTokens(n, bs, j) == bs; j++ {
		fp, ok := s.cache.get(hashes[j])
		if !ok {
			break
		}
		fps[j] = fp
		hits++
	}
	loaded, loadedTokens := 0, 0
	for ; j < len(hashes); j++ {
		blk, err := s.store.load(hashes[j], bb)
		if err != nil {
			break
		}
		fps[j] = Fingerprint(blk)
		loaded++
		loadedTokens += BlockTokens(n, bs, j)
	}
	buf := make([]byte, bb)
	stored := 0
	for ; j < len(hashes); j++ {
		FillBlock(buf, hashes[j], BlockTokens(n, bs, j)*s.cfg.KVBytesPerToken)
		fps[j] = Fingerprint(buf)
		if err := s.store.save(hashes[j], buf); err != nil {
			s.log.Error().Err(err).Msg("shared storage: cannot store a block")
			continue
		}
		stored++
	}
	cached := hits*bs + loadedTokens
	s.m.prefixQueries.Add(float64(n))
	s.m.prefixHits.Add(float64(hits * bs))
	s.m.localPrefillTokens.Add(float64(n - loadedTokens))
	s.m.prefillComputedTokens.Add(float64(n - cached))
	s.m.sharedLoadedBlocks.Add(float64(loaded))
	s.m.sharedStoredBlocks.Add(float64(stored))
	if loaded > 0 {
		s.m.sharedLoads.Inc()
	}
	if !s.computePrefill(ctx, time.Duration(n-cached)*s.cfg.PrefillPerToken) {
		return nil, 0, ctx.Err()
	}
	for k := hits; k < len(hashes); k++ {
		if BlockTokens(n, bs, k) == bs {
			s.cache.put(hashes[k], fps[k])
		}
	}
	return fps, cached, nil
}

// declineThreshold answers a request whose hit ratio is below its
// cache_hit_threshold: no output, finish_reason "cache_threshold" (Messages:
// stop_reason; Responses: status incomplete, incomplete_details.reason).
func (s *Sim) declineThreshold(out *sink, g *genRequest, o *output, hit int) {
	s.m.thresholdDeclines.Inc()
	o.promptTokens, o.cachedTokens, o.finish = len(g.prompt), hit, finishCacheThreshold
	s.log.Info().Str("request_id", o.requestID).Int("hit_tokens", hit).Int("prompt_tokens", len(g.prompt)).
		Float64("threshold", g.cacheHitThreshold).Msg("cache hit ratio below cache_hit_threshold: declined")
	if !g.stream {
		out.json(http.StatusOK, thresholdJSON(o))
		return
	}
	var evs []sseEvent
	switch o.api {
	case apiResponses:
		var obj map[string]any
		_ = json.Unmarshal(thresholdJSON(o), &obj)
		evs = append(streamOpen(o), namedEvent("response.incomplete", map[string]any{"type": "response.incomplete", "response": obj}))
	case apiMessages:
		evs = []sseEvent{streamOpen(o)[0],
			namedEvent("message_delta", map[string]any{"type": "message_delta",
				"delta": map[string]any{"stop_reason": finishCacheThreshold, "stop_sequence": nil},
				"usage": map[string]any{"output_tokens": 0}}),
			namedEvent("message_stop", map[string]any{"type": "message_stop"})}
	case apiChat:
		evs = append(streamOpen(o), dataEvent(chatChunk(o, map[string]any{}, finishCacheThreshold)), doneEvent)
	case apiGenerate:
		evs = []sseEvent{dataEvent(map[string]any{"request_id": o.requestID,
			"choices": []any{map[string]any{"index": 0, "token_ids": []int{}, "logprobs": nil, "finish_reason": finishCacheThreshold}}}), doneEvent}
	default:
		evs = []sseEvent{dataEvent(map[string]any{"id": o.id, "object": "text_completion", "created": o.created, "model": o.model,
			"choices": []any{map[string]any{"index": 0, "text": "", "logprobs": nil, "finish_reason": finishCacheThreshold}}}), doneEvent}
	}
	_ = out.end(evs...)
}

// thresholdJSON is the JSON answer of a declined request.
func thresholdJSON(o *output) []byte {
	b := responseJSON(o)
	if o.api != apiMessages && o.api != apiResponses {
		return b
	}
	var v map[string]any
	_ = json.Unmarshal(b, &v)
	if o.api == apiMessages {
		v["stop_reason"] = finishCacheThreshold
	} else {
		v["status"] = "incomplete"
		v["incomplete_details"] = map[string]any{"reason": finishCacheThreshold}
	}
	b, _ = json.Marshal(v)
	return b
}

// parseThreshold reads cache_hit_threshold, a number in [0, 1].
func (g *genRequest) parseThreshold(raw json.RawMessage) error {
	if absent(raw) {
		return nil
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil || v < 0 || v > 1 {
		return badRequest("cache_hit_threshold", "cache_hit_threshold must be a number within 0..1")
	}
	g.cacheHitThreshold = v
	return nil
}
