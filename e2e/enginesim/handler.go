package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 64 << 20

// Handler returns the simulator's HTTP routes.
func (s *Sim) Handler() http.Handler {
	mux := http.NewServeMux()
	for path, a := range map[string]api{
		"/v1/completions":        apiCompletions,
		"/v1/chat/completions":   apiChat,
		"/v1/responses":          apiResponses,
		"/v1/messages":           apiMessages,
		"/inference/v1/generate": apiGenerate,
	} {
		mux.HandleFunc("POST "+path, s.inference(a))
	}
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	// vLLM's GET /version; the version names the simulator and its wire shape.
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"version": "engine-sim+" + s.shape.name})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /sim/faults", s.getFaults)
	mux.HandleFunc("POST /sim/faults", s.postFaults)
	mux.HandleFunc("DELETE /sim/faults", s.deleteFaults)
	mux.HandleFunc("GET /sim/requests", s.listRequests)
	mux.HandleFunc("GET /sim/computed", s.listComputed)  // ledger.go
	mux.HandleFunc("GET /ec/{mm_hash}", s.serveEncoding) // encoder.go
	if s.kva != nil {
		mux.HandleFunc("POST /kv/alloc", s.kva.handleAlloc)
		mux.HandleFunc("POST /kv/free", s.kva.handleFree)
	}
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("DELETE /sim/requests", func(w http.ResponseWriter, _ *http.Request) {
		s.journal.clear()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes)) // journaled: what a passthrough sent
		s.journal.add(r, raw)
		writeError(w, http.StatusNotFound, "NotFoundError", "", "no route for "+r.Method+" "+r.URL.Path)
	})
	return mux
}

func writeError(w http.ResponseWriter, status int, typ, param, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(errorBody(status, typ, param, msg))
}

func errorType(status int) string {
	switch status {
	case 400:
		return "BadRequestError"
	case 404:
		return "NotFoundError"
	case 429:
		return "RateLimitError"
	case 503:
		return "ServiceUnavailableError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

// inference serves one inference API.
func (s *Sim) inference(a api) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
		s.journal.add(r, raw)
		s.mio.countRank(r.Header.Get("X-Data-Parallel-Rank")) // MoRI-IO (moriio.go)
		rid := r.Header.Get("X-Request-Id")
		if rid == "" {
			rid = randomHex(32)
		}
		w.Header().Set("X-Request-Id", rid)
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				s.m.badRequests.WithLabelValues("413").Inc()
				writeError(w, http.StatusRequestEntityTooLarge, "BadRequestError", "", "request body too large")
			}
			return
		}
		g, err := parseRequest(a, raw, s.cfg.DefaultMaxTokens)
		if err == nil {
			g.dpRank = r.Header.Get("X-Data-Parallel-Rank")
		}
		if err == nil && g.model != "" && g.model != s.cfg.Model {
			err = &requestError{status: 404, typ: "NotFoundError", param: "model", msg: "The model `" + g.model + "` does not exist."}
		}
		if err == nil {
			err = s.withHistory(g) // a previous_response_id's conversation (responses.go)
		}
		if err != nil {
			var re *requestError
			if !errors.As(err, &re) {
				re = &requestError{status: 400, typ: "BadRequestError", msg: err.Error()}
			}
			s.m.badRequests.WithLabelValues(strconv.Itoa(re.status)).Inc()
			s.log.Info().Str("request_id", rid).Int("status", re.status).Str("error", re.msg).Msg("bad request")
			writeError(w, re.status, re.typ, re.param, re.msg)
			return
		}
		leg := s.classify(g, rid)
		o := &output{api: a, requestID: rid, model: s.cfg.Model, created: time.Now().Unix(), kvInStream: s.cfg.BidirectionalKVXfer}
		if a == apiChat {
			o.reasoning = s.cfg.ReasoningTokens
		}
		defer s.countCancelled(ctx, leg, o)
		f := s.faults.take(leg)
		if f.held != nil {
			s.m.faultsInjected.WithLabelValues("hold").Inc()
			select {
			case <-f.held:
			case <-ctx.Done():
				return
			}
		}
		if !s.injectFaults(w, r, f.Faults, o) {
			return
		}
		if la, ok := ctx.Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
			o.localHost = la.IP.String()
		}
		switch a {
		case apiCompletions:
			o.id = "cmpl-" + rid
		case apiChat:
			o.id = "chatcmpl-" + rid
		case apiResponses:
			o.id = "resp_" + rid
		case apiMessages:
			o.id = "msg_" + rid
		default:
			o.id = rid
		}
		// The encoder stage (encoder.go): an encoder answers with
		// ec_transfer_params; other engines fold the items' encodings into
		// the prompt first.
		if s.cfg.Role == RoleEncode {
			s.serveEncode(w, r, g, o)
			o.ended = true
			return
		}
		if err := s.resolveMM(ctx, g); err != nil {
			if ctx.Err() != nil {
				return // the client left
			}
			s.log.Error().Str("request_id", rid).Err(err).Msg("encoder cache load failed")
			writeError(w, http.StatusInternalServerError, "InternalServerError", "", err.Error())
			o.ended = true
			return
		}
		s.log.Debug().Str("request_id", rid).Str("path", r.URL.Path).Str("leg", string(leg)).
			Int("prompt_tokens", len(g.prompt)).Int("max_tokens", g.maxTokens).Bool("stream", g.stream).Msg("request")
		s.execute(ctx, w, g, leg, f, o)
	}
}

// countCancelled counts a request whose client left before its answer was
// finished (o.ended unset), once, by the leg's kind; deferred by the
// handler, it sees every way a request ends.
func (s *Sim) countCancelled(ctx context.Context, leg legKind, o *output) {
	if o.ended || ctx.Err() == nil {
		return
	}
	s.m.requestsCancelled.WithLabelValues(leg.label()).Inc()
	s.log.Info().Str("request_id", o.requestID).Str("kind", leg.label()).Msg("client left before the answer; request cancelled")
}

// injectFaults applies the request-level faults of f; it reports whether the
// request should still be served. A request the faults answer or cut is
// marked ended in o.
func (s *Sim) injectFaults(w http.ResponseWriter, r *http.Request, f Faults, o *output) bool {
	ctx := r.Context()
	if f.LatencyMS > 0 {
		s.m.faultsInjected.WithLabelValues("latency").Inc()
		if !sleep(ctx, f.latency()) {
			return false
		}
	}
	switch {
	case f.Refuse:
		s.m.faultsInjected.WithLabelValues("refuse").Inc()
		o.ended = true
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
				c.Close()
				return false
			}
		}
		panic(http.ErrAbortHandler)
	case f.Hang:
		s.m.faultsInjected.WithLabelValues("hang").Inc()
		<-ctx.Done()
		return false
	case f.Status != 0:
		s.m.faultsInjected.WithLabelValues("status").Inc()
		writeError(w, f.Status, errorType(f.Status), "", "injected fault: status "+http.StatusText(f.Status))
		o.ended = true
		return false
	}
	if f.DieAfterChunks > 0 {
		s.m.faultsInjected.WithLabelValues("die_after_chunks").Inc()
	}
	return true
}

func (s *Sim) models(w http.ResponseWriter, r *http.Request) {
	s.journal.add(r, nil)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"object": "list",
		"data": []any{map[string]any{
			"id": s.cfg.Model, "object": "model", "created": time.Now().Unix(), "owned_by": "vllm",
			"root": s.cfg.Model, "parent": nil, "max_model_len": 131072,
		}},
	})
}

func (s *Sim) getFaults(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.faults.get())
}

func (s *Sim) postFaults(w http.ResponseWriter, r *http.Request) {
	var f Faults
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "", "faults: "+err.Error())
		return
	}
	if err := s.SetFaults(f); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "", err.Error())
		return
	}
	s.log.Info().Interface("faults", f).Msg("faults set")
	s.getFaults(w, r)
}

func (s *Sim) deleteFaults(w http.ResponseWriter, _ *http.Request) {
	s.faults.set(Faults{})
	s.log.Info().Msg("faults cleared")
	w.WriteHeader(http.StatusNoContent)
}

func (s *Sim) listRequests(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.journal.list())
}
