package enginesim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"
)

// The KV side channel is the simulator's stand-in for NIXL's (and SGLang's
// bootstrap) data path: a real TCP listener from which a decoder pulls the
// bytes of blocks a prefill holds for it.
//
// Protocol, one pull per connection:
//
//	decoder → prefiller: one JSON line, pullRequest
//	prefiller → decoder: one JSON line, pullHeader; when ok, the bytes of
//	                     every block in order (BlockBytes each)
//	decoder → prefiller: "done\n" after reading every byte; only then are
//	                     the blocks released (a decoder that vanishes
//	                     mid-pull leaves them to the lease)
//
// With bidirectional KV transfer the roles turn round: a prefill engine
// pulls a history from the decode engine that pinned it, with "history":
// true and the ids of the pinned blocks it reads, in order (possibly none:
// a pull of no blocks only tells the decoder to free them). Its "done"
// frees the whole pin (bidirectional.go).

// pullRequest names the blocks to pull: by NIXL-style ids, by SGLang room,
// or (on the P2P port) by kind and kv_request_id.
type pullRequest struct {
	EngineID  string  `json:"engine_id,omitempty"`
	RequestID string  `json:"request_id,omitempty"`
	BlockIDs  []int   `json:"block_ids,omitempty"`
	Room      *uint64 `json:"room,omitempty"`
	WaitMS    int     `json:"wait_ms,omitempty"`
	// Kind ("prefill" or "source"), KVRequestID and Hashes are the P2P
	// tier's: a source pull sends the chained hashes of the blocks it asks.
	Kind        string   `json:"kind,omitempty"`
	KVRequestID string   `json:"kv_request_id,omitempty"`
	Hashes      []uint64 `json:"block_hashes,omitempty"`
	// History asks a decode engine for some blocks of a pinned sequence
	// (RequestID, BlockIDs) and frees the pin once they were read.
	History bool `json:"history,omitempty"`
}

// pullHeader describes what follows.
type pullHeader struct {
	OK         bool     `json:"ok"`
	Error      string   `json:"error,omitempty"`
	BlockBytes int      `json:"block_bytes,omitempty"`
	NumTokens  int      `json:"num_tokens,omitempty"`
	BlockIDs   []int    `json:"block_ids,omitempty"`
	Checksums  []uint64 `json:"checksums,omitempty"`
}

// ErrKVPull is wrapped by every failed pull.
var ErrKVPull = errors.New("kv pull failed")

// serveKV accepts pulls on l until ctx ends.
func (s *Sim) serveKV(ctx context.Context, l net.Listener) error {
	return acceptEach(ctx, l, "kv side channel", func(c net.Conn) { s.servePull(ctx, c) })
}

// servePull serves one pull of held blocks (NIXL ids, SGLang room, Mooncake
// transfer) on c.
func (s *Sim) servePull(ctx context.Context, c net.Conn) {
	s.serveBlocks(ctx, c, s.findHold)
}

// acceptEach serves every connection accepted on l on its own goroutine
// until ctx ends (then it closes l and returns nil); what names the
// listener in the error of a failed Accept.
func acceptEach(ctx context.Context, l net.Listener, what string, serve func(net.Conn)) error {
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("%s accept: %w", what, err)
		}
		go serve(c)
	}
}

// serveBlocks serves one pull on c: it reads the request, resolves it with
// find, streams the blocks and, once the puller said "done", counts P2P
// blocks served and releases a stored hold.
func (s *Sim) serveBlocks(ctx context.Context, c net.Conn, find func(context.Context, pullRequest) (*hold, error)) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(s.cfg.BootstrapTimeout + 30*time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadBytes('\n')
	if err != nil {
		return
	}
	var req pullRequest
	if err := json.Unmarshal(line, &req); err != nil {
		writeHeader(c, pullHeader{Error: "bad pull request: " + err.Error()})
		return
	}
	h, err := find(ctx, req)
	if err != nil {
		s.log.Warn().Str("request_id", req.RequestID).Str("kv_request_id", req.KVRequestID).Err(err).Msg("kv pull refused")
		writeHeader(c, pullHeader{Error: err.Error()})
		return
	}
	hdr := pullHeader{OK: true, BlockBytes: s.blockBytes(), NumTokens: h.tokens, BlockIDs: h.blockIDs, Checksums: h.checksums}
	if err := writeHeader(c, hdr); err != nil {
		return
	}
	w := bufio.NewWriterSize(c, 64<<10)
	for i, b := range h.blocks {
		if h.corrupt && i == len(h.blocks)/2 {
			bad := slices.Clone(b)
			bad[len(bad)/3] ^= 0x5a
			b = bad
		}
		if _, err := w.Write(b); err != nil {
			return
		}
	}
	if err := w.Flush(); err != nil {
		return
	}
	done, err := r.ReadString('\n')
	if err != nil || done != "done\n" {
		return
	}
	if h.p2p != "" {
		s.m.p2pBlocksServed.WithLabelValues(h.p2p).Add(float64(len(h.blocks)))
	}
	if h.of != nil {
		h = h.of // a history pull frees the whole pin
	}
	if h.timer != nil && s.holds.release(h) {
		s.log.Debug().Str("request_id", h.requestID).Int("blocks", len(h.blocks)).Msg("kv pulled and released")
	}
}

func (s *Sim) findHold(ctx context.Context, req pullRequest) (*hold, error) {
	if req.Room != nil {
		return s.waitHold(ctx, *req.Room, req.WaitMS)
	}
	if req.EngineID != s.engineID {
		return nil, fmt.Errorf("engine id %q is not this engine (%s): %w", req.EngineID, s.engineID, ErrNoSuchTransfer)
	}
	h, ok := s.holds.get(req.RequestID)
	if !ok {
		return nil, fmt.Errorf("request %q: %w", req.RequestID, ErrNoSuchTransfer)
	}
	if req.History || h.pinned {
		return pinView(h, req, s.cfg.BlockSize)
	}
	if !slices.Equal(h.blockIDs, req.BlockIDs) {
		return nil, fmt.Errorf("request %q: block ids %v do not match held %v: %w", req.RequestID, req.BlockIDs, h.blockIDs, ErrNoSuchTransfer)
	}
	return h, nil
}

// waitHold waits for the hold registered under room, up to waitMS (bounded
// by, and by default, the bootstrap timeout).
func (s *Sim) waitHold(ctx context.Context, room uint64, waitMS int) (*hold, error) {
	wait := time.Duration(waitMS) * time.Millisecond
	if wait <= 0 || wait > s.cfg.BootstrapTimeout {
		wait = s.cfg.BootstrapTimeout
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return s.holds.waitRoom(wctx, room)
}

func writeHeader(w io.Writer, h pullHeader) error {
	b, _ := json.Marshal(h)
	_, err := w.Write(append(b, '\n'))
	return err
}

// pulled is the result of a pull.
type pulled struct {
	blocks    [][]byte
	checksums []uint64
	numTokens int
	bytes     int
}

// pull fetches blocks from a prefiller's side channel at addr, paced to
// bandwidth bytes/s (0: unpaced). It verifies the byte count, and the
// checksums when verify is set. Every failure wraps ErrKVPull.
func pull(ctx context.Context, addr string, req pullRequest, bandwidth float64, verify bool) (*pulled, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %w", ErrKVPull, addr, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("%w: send request: %w", ErrKVPull, err)
	}
	r := bufio.NewReaderSize(c, 64<<10)
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("%w: read header: %w", ErrKVPull, err)
	}
	var hdr pullHeader
	if err := json.Unmarshal(line, &hdr); err != nil {
		return nil, fmt.Errorf("%w: bad header: %w", ErrKVPull, err)
	}
	if !hdr.OK {
		return nil, fmt.Errorf("%w: prefiller refused: %s", ErrKVPull, hdr.Error)
	}
	if hdr.BlockBytes <= 0 || len(hdr.Checksums) != len(hdr.BlockIDs) {
		return nil, fmt.Errorf("%w: inconsistent header", ErrKVPull)
	}
	out := &pulled{numTokens: hdr.NumTokens, checksums: hdr.Checksums}
	start := time.Now()
	for range hdr.BlockIDs {
		blk := make([]byte, hdr.BlockBytes)
		if _, err := io.ReadFull(r, blk); err != nil {
			return nil, fmt.Errorf("%w: block %d of %d: %w", ErrKVPull, len(out.blocks), len(hdr.BlockIDs), err)
		}
		out.blocks = append(out.blocks, blk)
		out.bytes += len(blk)
		if bandwidth > 0 {
			due := time.Duration(float64(out.bytes) / bandwidth * float64(time.Second))
			if wait := due - time.Since(start); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return nil, fmt.Errorf("%w: %w", ErrKVPull, ctx.Err())
				}
			}
		}
	}
	if verify {
		for i, blk := range out.blocks {
			if Fingerprint(blk) != hdr.Checksums[i] {
				return nil, fmt.Errorf("%w: block %d checksum mismatch", ErrKVPull, hdr.BlockIDs[i])
			}
		}
	}
	if _, err := c.Write([]byte("done\n")); err != nil {
		return nil, fmt.Errorf("%w: send done: %w", ErrKVPull, err)
	}
	return out, nil
}
