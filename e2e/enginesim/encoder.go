package enginesim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The encoder stage (vLLM's encoder/prefill/decode disaggregation, EPD).
//
// A multimodal content part of a chat message (image_url, audio_url,
// video_url, input_audio) is an "item". Its mm_hash is the first 16 hex
// digits of SHA-256(type, URL or data); its "encoding" is a few words
// derived from SHA-256 of the same bytes (encodingOf). Every engine folds
// the encodings of a request's items into the prompt, after the text, so
// the output tokens depend on them: a missing or wrong encoding gives other
// tokens than the right one, and an engine that encodes the item itself
// gives the same tokens as one that got the right encoding from an encoder.
//
// RoleEncode answers the one-item encoder request (max_tokens 1): it
// encodes each item, holds the encoding under its mm_hash, and answers one
// token plus ec_transfer_params as vLLM's ECCPUConnector does (wirecorpus
// shape vllm-ec-nixl-shape): {"<mm_hash>": {"metadata": {}, "peer_host",
// "peer_port", "size_bytes", "shape"}}; with ECSharedDir it also writes the
// encoding to <dir>/<mm_hash> (ec-example's shared encoder cache). Any
// engine serves GET /ec/{mm_hash} (the encoding, text/plain), the stand-in
// of the encoder's NIXL read. A prefill or decode engine resolves each
// item: an ec_transfer_params entry for its mm_hash that names a peer
// (peer_host, peer_port, size_bytes: every upstream generation has them;
// an entry with none, {"metadata": {}}, is an item to encode here) is
// fetched from that encoder over HTTP and its size checked
// (sim_ec_loaded_items_total{source="remote"}),
// else ECSharedDir's file is read ({source="shared"}), else the engine
// encodes it itself (sim_ec_local_encodes_total); an item repeated in one
// request is resolved (and counted) once. An entry that cannot be
// fetched fails the request 500 (sim_ec_load_failures_total), as vLLM's
// consumer fails on a missing encoder cache entry.

// RoleEncode answers one-item encoder requests only (EPD's encoder).
const RoleEncode Role = "encode"

// mmItem is one multimodal content part.
type mmItem struct {
	kind string // the part's type
	src  string // the URL, or input_audio's data
}

var mmKinds = map[string]bool{"image_url": true, "audio_url": true, "video_url": true, "input_audio": true}

// mmItemsOf returns the multimodal parts of a messages list, in order.
func mmItemsOf(raw json.RawMessage) []mmItem {
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &msgs) != nil {
		return nil
	}
	var items []mmItem
	for _, m := range msgs {
		var parts []map[string]json.RawMessage
		if json.Unmarshal(m.Content, &parts) != nil {
			continue
		}
		for _, p := range parts {
			var kind string
			if json.Unmarshal(p["type"], &kind) != nil || !mmKinds[kind] {
				continue
			}
			var v struct {
				URL  string `json:"url"`
				Data string `json:"data"`
			}
			_ = json.Unmarshal(p[kind], &v)
			src := v.URL
			if kind == "input_audio" {
				src = v.Data
			}
			items = append(items, mmItem{kind: kind, src: src})
		}
	}
	return items
}

func (it mmItem) digest() [32]byte { return sha256.Sum256([]byte(it.kind + "\x00" + it.src)) }

// hash is the item's mm_hash, the key of its ec_transfer_params entry and
// of its shared-cache file.
func (it mmItem) hash() string {
	d := it.digest()
	return hex.EncodeToString(d[:8])
}

// encodingOf is the item's encoding: four words from its digest.
func encodingOf(it mmItem) string {
	d := it.digest()
	words := make([]string, 4)
	for i := range words {
		words[i] = "mm" + hex.EncodeToString(d[8+2*i:10+2*i])
	}
	return strings.Join(words, " ")
}

// ecRef is one ec_transfer_params entry: where an item's encoding is held,
// and its size.
type ecRef struct {
	PeerHost  string `json:"peer_host"`
	PeerPort  int    `json:"peer_port"`
	SizeBytes *int   `json:"size_bytes"`
}

// parseECParams reads ec_transfer_params: entries that name no peer and
// size are ignored (vLLM encodes those items itself).
func parseECParams(raw json.RawMessage) map[string]ecRef {
	var m map[string]json.RawMessage
	if absent(raw) || json.Unmarshal(raw, &m) != nil {
		return nil
	}
	out := map[string]ecRef{}
	for k, v := range m {
		var r ecRef
		if json.Unmarshal(v, &r) == nil && r.PeerHost != "" && r.PeerPort > 0 && r.SizeBytes != nil {
			out[k] = r
		}
	}
	return out
}

// ecStore holds encodings by mm_hash for consumers to fetch, the oldest
// dropped past ecStoreMax.
type ecStore struct {
	mu    sync.Mutex
	byID  map[string]string
	order []string
}

const ecStoreMax = 4096

func (e *ecStore) put(hash, enc string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byID == nil {
		e.byID = map[string]string{}
	}
	if _, ok := e.byID[hash]; !ok {
		e.order = append(e.order, hash)
	}
	e.byID[hash] = enc
	if len(e.order) > ecStoreMax {
		delete(e.byID, e.order[0])
		e.order = e.order[1:]
	}
}

func (e *ecStore) get(hash string) (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	enc, ok := e.byID[hash]
	return enc, ok
}

// ecMetrics are the encoder stage's proof counters.
type ecMetrics struct {
	encodes, served, localEncodes, loadFailures prometheus.Counter
	loaded                                      *prometheus.CounterVec
}

func newECMetrics(reg prometheus.Registerer, model string) *ecMetrics {
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	c := func(name, help string) prometheus.Counter {
		x := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		reg.MustRegister(x)
		return x
	}
	m := &ecMetrics{
		encodes:      c("sim_ec_encodes_total", "Items this encoder encoded and holds for consumers (role encode)."),
		served:       c("sim_ec_items_served_total", "Encodings this encoder served to consumers by mm_hash (GET /ec/{mm_hash})."),
		localEncodes: c("sim_ec_local_encodes_total", "Items a prefill/decode engine encoded itself (no encoder output for them)."),
		loadFailures: c("sim_ec_load_failures_total", "Requests failed because an ec_transfer_params entry could not be fetched."),
		loaded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sim_ec_loaded_items_total",
			Help: "Items whose encoding came from an encoder, by source (remote: an ec_transfer_params entry; shared: the shared encoder cache).", ConstLabels: labels}, []string{"source"}),
	}
	reg.MustRegister(m.loaded)
	m.loaded.WithLabelValues("remote")
	m.loaded.WithLabelValues("shared")
	return m
}

// serveEncode answers an encoder request (role encode): every item of g is
// encoded and held; the answer is one token with ec_transfer_params.
func (s *Sim) serveEncode(w http.ResponseWriter, r *http.Request, g *genRequest, o *output) {
	host, port := s.cfg.Host, 0
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		port = la.Port
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			host = la.IP.String()
		}
	}
	params := map[string]any{}
	for _, it := range g.mm {
		enc := encodingOf(it)
		s.ec.put(it.hash(), enc)
		if s.cfg.ECSharedDir != "" {
			if err := writeFileAtomic(filepath.Join(s.cfg.ECSharedDir, it.hash()), []byte(enc)); err != nil {
				writeError(w, http.StatusInternalServerError, "InternalServerError", "", "shared encoder cache: "+err.Error())
				return
			}
		}
		s.ecm.encodes.Inc()
		params[it.hash()] = map[string]any{"metadata": map[string]any{}, "peer_host": host, "peer_port": port,
			"size_bytes": len(enc), "shape": []int{1, len(enc)}}
	}
	body := map[string]any{
		"id": o.id, "object": "chat.completion", "created": o.created, "model": o.model,
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": Word(FirstTextToken)},
			"finish_reason": "length"}},
		"usage":              map[string]any{"prompt_tokens": len(g.prompt), "completion_tokens": 1, "total_tokens": len(g.prompt) + 1},
		"ec_transfer_params": params,
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp" + randomHex(8)
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// serveEncoding is GET /ec/{mm_hash}: a held encoding (with the corrupt_kv
// fault, a wrong one).
func (s *Sim) serveEncoding(w http.ResponseWriter, r *http.Request) {
	enc, ok := s.ec.get(r.PathValue("mm_hash"))
	if !ok {
		writeError(w, http.StatusNotFound, "NotFoundError", "", "no encoding under this mm_hash")
		return
	}
	if s.faults.get().CorruptKV {
		s.m.faultsInjected.WithLabelValues("corrupt_ec").Inc()
		// Wrong bytes of the right size, as a corrupted NIXL read: the
		// first word's digits flipped.
		enc = "mmdead" + enc[min(6, len(enc)):]
	}
	s.ecm.served.Inc()
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, enc)
}

// errECLoad: an ec_transfer_params entry could not be fetched.
var errECLoad = errors.New("encoder cache load failed")

// resolveMM folds the encodings of g's items into its prompt, fetching
// those ec_transfer_params name, reading the shared encoder cache, or
// encoding the rest itself.
func (s *Sim) resolveMM(ctx context.Context, g *genRequest) error {
	var encs []string
	seen := map[string]string{} // an item repeated in the request is resolved once
	for _, it := range g.mm {
		enc, ok := seen[it.hash()]
		if !ok {
			var err error
			if enc, err = s.encodingFor(ctx, g, it); err != nil {
				s.ecm.loadFailures.Inc()
				return fmt.Errorf("%w: item %s: %w", errECLoad, it.hash(), err)
			}
			seen[it.hash()] = enc
		}
		encs = append(encs, enc)
	}
	if len(encs) > 0 {
		g.prompt = append(g.prompt, Tokenize(strings.Join(encs, " "))...)
	}
	return nil
}

func (s *Sim) encodingFor(ctx context.Context, g *genRequest, it mmItem) (string, error) {
	h := it.hash()
	if ref, ok := g.ec[h]; ok {
		enc, err := fetchEncoding(ctx, h, ref)
		if err != nil {
			return "", err
		}
		s.ecm.loaded.WithLabelValues("remote").Inc()
		return enc, nil
	}
	if s.cfg.ECSharedDir != "" {
		if b, err := os.ReadFile(filepath.Join(s.cfg.ECSharedDir, h)); err == nil {
			s.ecm.loaded.WithLabelValues("shared").Inc()
			return string(b), nil
		}
	}
	s.ecm.localEncodes.Inc()
	return encodingOf(it), nil
}

func fetchEncoding(ctx context.Context, hash string, ref ecRef) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	u := "http://" + net.JoinHostPort(ref.PeerHost, strconv.Itoa(ref.PeerPort)) + "/ec/" + hash
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
	}
	if len(b) != *ref.SizeBytes {
		return "", fmt.Errorf("GET %s: %d bytes, size_bytes %d", u, len(b), *ref.SizeBytes)
	}
	return string(b), nil
}
