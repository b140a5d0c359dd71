package enginesim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MoRI-IO write mode (AMD's KV transfer engine as vLLM's MoRIIOConnector
// drives it): the prefill engine WRITES the prompt's KV into the decode
// engine instead of the decode engine pulling it. The simulator's stand-in
// is the notify port: a TCP listener on decode-capable engines
// (--moriio-notify-port) that receives pushed blocks under a transfer_id
// into an inbox, where a decode leg with the same transfer_id waits for
// them (bounded by --bootstrap-timeout) and decodes from their bytes.
//
// Push protocol, one push per connection:
//
//	prefiller → decoder: one JSON line, moriPush; then the bytes of every
//	                     block in order (BlockBytes each)
//	decoder → prefiller: "ok\n" once every byte is stored, else
//	                     "error <why>\n"
//
// A prefill leg is MoRI-IO's when its kv_transfer_params carry
// remote_notify_port and transfer_id with do_remote_decode; a decode leg
// when they carry remote_notify_port and transfer_id with
// do_remote_prefill. The proof counters move only when blocks moved:
// sim_moriio_blocks_pushed_total (prefiller, acknowledged pushes),
// sim_moriio_blocks_received_total (decoder, stored pushes) and
// sim_moriio_blocks_used_total (decoder, blocks a decode read its KV from).

// moriPush describes the blocks that follow.
type moriPush struct {
	TransferID string   `json:"transfer_id"`
	NumTokens  int      `json:"num_tokens"`
	BlockBytes int      `json:"block_bytes"`
	Checksums  []uint64 `json:"checksums"`
	DPRank     *int     `json:"dp_rank,omitempty"`
}

// moriIO is an engine's MoRI-IO state: its inbox and proof counters.
type moriIO struct {
	lease time.Duration

	pushed, received, used prometheus.Counter
	prefills, decodes      prometheus.Counter
	waitTimeouts           prometheus.Counter
	rankHeaders            *prometheus.CounterVec

	mu    sync.Mutex
	inbox map[string]*moriSlot
}

// moriSlot is one transfer: the pushed KV once it arrived (ready closed).
type moriSlot struct {
	ready chan struct{}
	kv    *pulled
	taken bool
}

func newMoriIO(reg prometheus.Registerer, model string, lease time.Duration) *moriIO {
	labels := prometheus.Labels{"model_name": model}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		reg.MustRegister(c)
		return c
	}
	m := &moriIO{
		lease:        lease,
		pushed:       counter("sim_moriio_blocks_pushed_total", "KV blocks this prefill engine wrote into a decode engine's notify port (acknowledged), MoRI-IO write mode."),
		received:     counter("sim_moriio_blocks_received_total", "KV blocks written into this engine's notify port and stored under their transfer_id."),
		used:         counter("sim_moriio_blocks_used_total", "Pushed KV blocks a decode leg read its KV from."),
		prefills:     counter("sim_moriio_prefills_total", "MoRI-IO write-mode prefills whose KV was written into the decode engine."),
		decodes:      counter("sim_moriio_decodes_total", "MoRI-IO write-mode decodes that decoded from pushed KV."),
		waitTimeouts: counter("sim_moriio_wait_timeouts_total", "MoRI-IO decodes whose KV was not written within --bootstrap-timeout."),
		rankHeaders: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sim_dp_rank_header_requests_total",
			Help: "Inference requests that carried x-data-parallel-rank, by its value.", ConstLabels: labels}, []string{"rank"}),
		inbox: map[string]*moriSlot{},
	}
	reg.MustRegister(m.rankHeaders)
	return m
}

// countRank counts a request's x-data-parallel-rank header.
func (m *moriIO) countRank(v string) {
	if v == "" {
		return
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 && n < 1024 {
		m.rankHeaders.WithLabelValues(strconv.Itoa(n)).Inc()
	}
}

// slot returns the transfer's slot, created when absent; the caller holds mu.
func (m *moriIO) slot(id string) *moriSlot {
	s := m.inbox[id]
	if s == nil {
		s = &moriSlot{ready: make(chan struct{})}
		m.inbox[id] = s
	}
	return s
}

// deliver stores pushed KV under id; it is freed after the lease unless a
// decode took it.
func (m *moriIO) deliver(id string, kv *pulled) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.slot(id)
	if s.kv != nil {
		return fmt.Errorf("transfer %q already written", id)
	}
	s.kv = kv
	close(s.ready)
	time.AfterFunc(m.lease, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.inbox[id] == s {
			delete(m.inbox, id)
		}
	})
	return nil
}

// errMoriWait: the KV of a transfer was not written in time.
var errMoriWait = errors.New("MoRI-IO KV not written in time")

// take waits up to wait for the KV written under id and takes it.
func (m *moriIO) take(ctx context.Context, id string, wait time.Duration) (*pulled, error) {
	m.mu.Lock()
	s := m.slot(id)
	m.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-s.ready:
	case <-ctx.Done():
		m.forget(id, s)
		return nil, ctx.Err()
	case <-t.C:
		m.forget(id, s)
		m.waitTimeouts.Inc()
		return nil, fmt.Errorf("%w: transfer %q after %v", errMoriWait, id, wait)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.taken {
		return nil, fmt.Errorf("transfer %q already decoded", id)
	}
	s.taken = true
	delete(m.inbox, id)
	return s.kv, nil
}

// forget drops a slot nobody wrote into.
func (m *moriIO) forget(id string, s *moriSlot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.inbox[id] == s && s.kv == nil {
		delete(m.inbox, id)
	}
}

// serveMoriNotify accepts pushes on l until ctx ends.
func (s *Sim) serveMoriNotify(ctx context.Context, l net.Listener) error {
	return acceptEach(ctx, l, "moriio notify", func(c net.Conn) { s.receivePush(c) })
}

// receivePush stores one push read from c.
func (s *Sim) receivePush(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(s.cfg.BootstrapTimeout + 30*time.Second))
	r := bufio.NewReaderSize(c, 64<<10)
	refuse := func(why string) {
		s.log.Warn().Str("reason", why).Msg("moriio push refused")
		_, _ = io.WriteString(c, "error "+why+"\n")
	}
	line, err := r.ReadBytes('\n')
	if err != nil {
		return
	}
	var h moriPush
	if err := json.Unmarshal(line, &h); err != nil || h.TransferID == "" || h.BlockBytes <= 0 || h.BlockBytes > 64<<20 {
		refuse("bad push header")
		return
	}
	kv := &pulled{numTokens: h.NumTokens, checksums: h.Checksums}
	for range h.Checksums {
		blk := make([]byte, h.BlockBytes)
		if _, err := io.ReadFull(r, blk); err != nil {
			return
		}
		kv.blocks = append(kv.blocks, blk)
		kv.bytes += len(blk)
	}
	if err := s.mio.deliver(h.TransferID, kv); err != nil {
		refuse(err.Error())
		return
	}
	s.mio.received.Add(float64(len(kv.blocks)))
	s.log.Debug().Str("transfer_id", h.TransferID).Int("blocks", len(kv.blocks)).Msg("moriio kv written")
	_, _ = io.WriteString(c, "ok\n")
}

// isMoriIO reports whether the request's kv_transfer_params are MoRI-IO
// write mode's.
func (g *genRequest) isMoriIO() bool {
	return g.kv != nil && g.kv.RemoteNotifyPort != nil && g.kv.TransferID != nil && *g.kv.TransferID != ""
}

// invalidForMoriIO reports why MoRI-IO decode params cannot be used.
func (p *kvParams) invalidForMoriIO() string {
	if p.TransferID == nil || *p.TransferID == "" {
		return "missing transfer_id"
	}
	return ""
}

// pushKV writes the prompt's blocks (bytes from their hashes, as every
// prefill materialises them) into the decode engine the prefill leg's
// kv_transfer_params name: remote_host, remote_notify_port.
func (s *Sim) pushKV(ctx context.Context, g *genRequest, f Faults, hashes []uint64) error {
	kv := g.kv
	if kv.RemoteHost == nil || *kv.RemoteHost == "" {
		return errors.New("MoRI-IO prefill without remote_host")
	}
	addr := net.JoinHostPort(*kv.RemoteHost, strconv.Itoa(*kv.RemoteNotifyPort))
	bb := s.blockBytes()
	h := moriPush{TransferID: *kv.TransferID, NumTokens: len(g.prompt), BlockBytes: bb, DPRank: kv.RemoteDPRank}
	blocks := make([][]byte, len(hashes))
	for j, hash := range hashes {
		blk := make([]byte, bb)
		FillBlock(blk, hash, BlockTokens(len(g.prompt), s.cfg.BlockSize, j)*s.cfg.KVBytesPerToken)
		if f.CorruptKV && j == len(hashes)/2 {
			blk[len(blk)/3] ^= 0x5a
		}
		blocks[j] = blk
		h.Checksums = append(h.Checksums, Fingerprint(blk))
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.BootstrapTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(pctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("MoRI-IO write to %s: %w", addr, err)
	}
	defer c.Close()
	stop := context.AfterFunc(pctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	w := bufio.NewWriterSize(c, 64<<10)
	b, _ := json.Marshal(h)
	_, _ = w.Write(append(b, '\n'))
	for _, blk := range blocks {
		if _, err := w.Write(blk); err != nil {
			return fmt.Errorf("MoRI-IO write to %s: %w", addr, err)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("MoRI-IO write to %s: %w", addr, err)
	}
	ack, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("MoRI-IO write to %s: no acknowledgement: %w", addr, err)
	}
	if ack != "ok\n" {
		return fmt.Errorf("MoRI-IO write to %s refused: %s", addr, strings.TrimSpace(ack))
	}
	s.mio.pushed.Add(float64(len(blocks)))
	s.mio.prefills.Inc()
	return nil
}

// moriPrefillAnswer sets the prefill answer's kv_transfer_params after the
// KV was written: what a serial decode leg needs to name the transfer. It
// leaves transfer_id and the notify port out, which the sidecar fills in.
func (s *Sim) moriPrefillAnswer(g *genRequest, o *output) {
	host := "127.0.0.1"
	if o.localHost != "" {
		host = o.localHost
	}
	kv := map[string]any{
		"do_remote_prefill": true,
		"do_remote_decode":  false,
		"remote_engine_id":  s.engineID,
		"remote_block_ids":  []int{},
		"remote_host":       host,
		"remote_port":       0,
		"tp_size":           s.cfg.TPSize,
	}
	if g.kv.RemoteDPRank != nil {
		kv["remote_dp_rank"] = *g.kv.RemoteDPRank
	}
	o.kv = kv
}

// takeMoriKV waits for the KV written under the decode leg's transfer_id.
func (s *Sim) takeMoriKV(ctx context.Context, g *genRequest) (*pulled, error) {
	kv, err := s.mio.take(ctx, *g.kv.TransferID, s.cfg.BootstrapTimeout)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKVPull, err)
	}
	return kv, nil
}

// useMoriKV decodes from the KV written under the decode leg's
// transfer_id: it checks the KV covers the prompt (and, with
// KVVerifyChecksums, the bytes), counts the blocks used and returns their
// fingerprints.
func (s *Sim) useMoriKV(ctx context.Context, g *genRequest, hashes []uint64) ([]uint64, error) {
	kv, err := s.takeMoriKV(ctx, g)
	if err != nil {
		return nil, err
	}
	if kv.numTokens != len(g.prompt) || len(kv.blocks) != len(hashes) {
		return nil, fmt.Errorf("%w: MoRI-IO wrote %d tokens in %d blocks, prompt has %d tokens in %d blocks",
			ErrKVPull, kv.numTokens, len(kv.blocks), len(g.prompt), len(hashes))
	}
	fps := make([]uint64, len(kv.blocks))
	for i, b := range kv.blocks {
		fps[i] = Fingerprint(b)
		if s.cfg.KVVerifyChecksums && fps[i] != kv.checksums[i] {
			return nil, fmt.Errorf("%w: MoRI-IO block %d checksum mismatch", ErrKVPull, i)
		}
	}
	s.mio.used.Add(float64(len(kv.blocks)))
	s.mio.decodes.Inc()
	return fps, nil
}
