package enginesim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// vLLM MooncakeConnector, the engine side. The prefiller's bootstrap port
// serves two protocols, told apart by the first bytes of each connection:
// HTTP (Mooncake's "GET /query", answered with the engine id and where to
// pull from, keyed by data-parallel rank) and the raw KV side channel
// (SGLang rooms, and Mooncake pulls by transfer_id).

// mooncakeKey maps a transfer_id of the prefill engine (rank) engineID
// onto the hold store's room keys: a decode that names another rank's
// engine than the one the prefill ran on finds no transfer, and waits for
// it, as vLLM's Mooncake decode does.
func mooncakeKey(engineID, transferID string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("mooncake:"))
	_, _ = h.Write([]byte(engineID))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(transferID))
	return h.Sum64()
}

// rankEngineID is the engine id of data-parallel rank r: vLLM's Mooncake
// connector appends _dp<rank> to the engine id under data parallelism.
func (s *Sim) rankEngineID(r int) string {
	if s.cfg.MooncakeDPRanks == 1 {
		return s.engineID
	}
	return s.engineID + "_dp" + strconv.Itoa(r)
}

// mooncakeRank is the engine id of the rank a Mooncake prefill runs on:
// the one its X-data-parallel-rank header names, else the next in turn.
func (s *Sim) mooncakeRank(header string) string {
	if r, err := strconv.Atoi(header); err == nil && r >= 0 && r < s.cfg.MooncakeDPRanks {
		return s.rankEngineID(r)
	}
	return s.rankEngineID(int(s.nextRank.Add(1)-1) % s.cfg.MooncakeDPRanks)
}

// isMooncake reports whether the request carries a Mooncake transfer_id.
func (g *genRequest) isMooncake() bool {
	return g.kv != nil && g.kv.TransferID != nil && *g.kv.TransferID != "" && g.kv.RemoteNotifyPort == nil // not MoRI-IO's
}

// invalidForMooncake reports why Mooncake decode params cannot be used.
func (p *kvParams) invalidForMooncake() string {
	var missing []string
	if *p.TransferID == "" {
		missing = append(missing, "transfer_id")
	}
	if p.RemoteBootstrapAddr == nil || *p.RemoteBootstrapAddr == "" {
		missing = append(missing, "remote_bootstrap_addr")
	}
	if p.RemoteEngineID == nil || *p.RemoteEngineID == "" {
		missing = append(missing, "remote_engine_id")
	}
	if len(missing) > 0 {
		return "missing " + strings.Join(missing, ", ")
	}
	return ""
}

// bootstrapEntry is one rank of the GET /query answer: vLLM's engine_id
// and worker_addr (tp rank -> pp rank -> address; wirecorpus shape
// vllm-mooncake-bootstrap-dp2), and the simulator's own pull address.
type bootstrapEntry struct {
	EngineID   string                       `json:"engine_id"`
	WorkerAddr map[string]map[string]string `json:"worker_addr"`
	KVHost     string                       `json:"kv_host"`
	KVPort     int                          `json:"kv_port"`
	TPSize     int                          `json:"tp_size"`
}

// serveBootstrap accepts connections on the bootstrap port and hands each
// to the HTTP bootstrap server or to the KV side channel.
func (s *Sim) serveBootstrap(ctx context.Context, l net.Listener) error {
	hl := &connListener{addr: l.Addr(), conns: make(chan net.Conn), done: make(chan struct{})}
	srv := &http.Server{Handler: http.HandlerFunc(s.bootstrapQuery), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(hl) }()
	defer func() { _ = srv.Close() }()
	return acceptEach(ctx, l, "bootstrap", func(c net.Conn) { s.route(ctx, c, hl) })
}

// route peeks at a new bootstrap connection: "GET " goes to HTTP, anything
// else to the KV side channel.
func (s *Sim) route(ctx context.Context, c net.Conn, hl *connListener) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	head, err := br.Peek(4)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		return
	}
	pc := &peekedConn{Conn: c, r: br}
	if string(head) == "GET " {
		if !hl.push(pc) {
			c.Close()
		}
		return
	}
	s.servePull(ctx, pc)
}

// bootstrapQuery answers GET /query.
func (s *Sim) bootstrapQuery(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/query" {
		writeError(w, http.StatusNotFound, "NotFoundError", "", "no route for "+r.Method+" "+r.URL.Path)
		return
	}
	s.m.mooncakeQueries.Inc()
	kv := s.KVAddr()
	host := kv.IP.String()
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok && kv.IP.IsUnspecified() {
		host = la.IP.String()
	}
	w.Header().Set("Content-Type", "application/json")
	ranks := make(map[string]bootstrapEntry, s.cfg.MooncakeDPRanks)
	for r := range s.cfg.MooncakeDPRanks {
		addr := "tcp://" + net.JoinHostPort(host, strconv.Itoa(kv.Port))
		ranks[strconv.Itoa(r)] = bootstrapEntry{EngineID: s.rankEngineID(r), WorkerAddr: map[string]map[string]string{"0": {"0": addr}},
			KVHost: host, KVPort: kv.Port, TPSize: s.cfg.TPSize}
	}
	_ = json.NewEncoder(w).Encode(ranks)
}

// queryBootstrap asks a Mooncake bootstrap server (base URL) for the rank
// whose engine id is engineID, walking every rank as vLLM's decode does.
func queryBootstrap(ctx context.Context, base, engineID string) (bootstrapEntry, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/query", nil)
	if err != nil {
		return bootstrapEntry{}, fmt.Errorf("%w: bootstrap query: %w", ErrKVPull, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return bootstrapEntry{}, fmt.Errorf("%w: bootstrap query: %w", ErrKVPull, err)
	}
	defer resp.Body.Close()
	var m map[string]bootstrapEntry
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&m); err != nil || resp.StatusCode != http.StatusOK {
		return bootstrapEntry{}, fmt.Errorf("%w: bootstrap query answered %d: %v", ErrKVPull, resp.StatusCode, err)
	}
	for _, e := range m {
		if e.EngineID == engineID {
			return e, nil
		}
	}
	return bootstrapEntry{}, fmt.Errorf("%w: remote_engine_id %q is no rank's engine on the bootstrap server", ErrKVPull, engineID)
}

// mooncakePull resolves a Mooncake decode's transfer: the bootstrap query
// (whose engine id must be the one the decode names), then the pull request
// by transfer_id, waiting for the prefill to register it.
func (s *Sim) mooncakePull(ctx context.Context, g *genRequest) (string, pullRequest, error) {
	e, err := queryBootstrap(ctx, *g.kv.RemoteBootstrapAddr, *g.kv.RemoteEngineID)
	if err != nil {
		return "", pullRequest{}, err
	}
	key := mooncakeKey(e.EngineID, *g.kv.TransferID)
	req := pullRequest{Room: &key, WaitMS: int(s.cfg.BootstrapTimeout / time.Millisecond)}
	return net.JoinHostPort(e.KVHost, strconv.Itoa(e.KVPort)), req, nil
}

// peekedConn is a connection whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

// Read reads through the peek buffer.
func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// connListener is a net.Listener fed with connections by route.
type connListener struct {
	addr  net.Addr
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func (l *connListener) push(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

// Accept returns the next routed connection.
func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept.
func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is the bootstrap listener's address.
func (l *connListener) Addr() net.Addr { return l.addr }

// awaitPull keeps a bootstrap-style prefill (SGLang room, Mooncake
// transfer) in flight until its KV was pulled, as SGLang's prefill server
// answers only once the transfer is done. A prefill request that ends first
// (the proxy cancelled it) frees the KV at once. It reports whether the
// request may still be answered.
func (s *Sim) awaitPull(ctx context.Context, h *hold) bool {
	if h == nil {
		return true
	}
	select {
	case <-h.done:
		return ctx.Err() == nil
	case <-ctx.Done():
		s.releaseCancelled(h)
		return false
	}
}

// releaseCancelled frees the KV of a prefill whose request was cancelled
// (nil: nothing held). A hold already pulled or expired is left alone and
// not counted.
func (s *Sim) releaseCancelled(h *hold) {
	if h == nil {
		return
	}
	var freed bool
	if h.exported {
		freed = s.kva.agent.Drop(h.requestID) // its OnRelease frees the blocks
	} else {
		freed = s.holds.release(h)
	}
	if !freed {
		return
	}
	s.m.kvReleasedOnCancel.Inc()
	s.log.Info().Str("request_id", h.requestID).Int("blocks", len(h.blocks)).Msg("prefill cancelled before its KV was pulled; blocks freed")
}

// roomKey is the hold-store key of a bootstrap-style prefill.
func roomKey(g *genRequest) uint64 {
	if g.isMooncake() {
		return mooncakeKey(g.mooncakeEngine, *g.kv.TransferID)
	}
	return g.boot.room
}

// roomHold returns the hold registered under room, or nil when there is
// none (any more).
func (s *holdStore) roomHold(room uint64) *hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rooms[room]
}
