// Package front is the sidecar's HTTP front: the listeners and fasthttp
// servers of every data-parallel rank's port and of the metrics port, the
// checks every request's head, version and target pass before anything
// else reads it, the sidecar's own routes (/health, /metrics, /debug/pd),
// passthrough to the local engine, and the drain on shutdown. An inference
// request it hands to proxy/inference, which serves it through the
// drivers; an idle connection it hands to the lane where one runs.
package front

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/netloop"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
)

// Run listens on every data-parallel rank's port (and the metrics port) and
// serves until ctx is done; then it stops accepting, reports not ready, and
// drains in-flight requests for up to ShutdownGrace. It returns an error
// when a port cannot be bound, a server fails, or the drain timed out.
func Run(ctx context.Context, p *inference.Proxy) error {
	// The background work, until the shutdown begins or, for what the
	// requests in flight use, until they have drained; stopped here as
	// well when serving fails to start.
	var bg core.Workers
	defer bg.Stop()
	for _, w := range p.Background {
		wctx := ctx
		if w.ThroughDrain {
			wctx = context.WithoutCancel(ctx)
		}
		bg.Start(wctx, w)
	}
	var servers []*fasthttp.Server
	var lns []net.Listener
	closeAll := func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}
	listen := func(port int, h fasthttp.RequestHandler) error {
		addr := net.JoinHostPort(p.Cfg.Host, strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			closeAll()
			return err // "listen tcp <addr>: ...": it names the step and the address
		}
		lns = append(lns, ln)
		servers = append(servers, newServer(p, h))
		return nil
	}
	if p.Cfg.StreamLoops > 0 {
		g, err := netloop.NewGroup(p.Cfg.StreamLoops)
		switch {
		case errors.Is(err, netloop.ErrUnsupported):
			p.Log.Info().Msg("no event loops on this platform: each open stream keeps its goroutine")
		case err != nil:
			return err
		default:
			p.Loops = g
			defer g.Close()
		}
	}
	p.Servers = make(map[string]*fasthttp.Server, p.Cfg.DataParallelSize)
	var lanes []inference.Lane
	defer func() {
		for _, ln := range lanes {
			ln.Shutdown()
		}
	}()
	var tails *clientconn.TailPool // the byte counts matter where connections move to the loops
	if p.Loops != nil {
		tails = clientconn.NewTailPool(p.Cfg.Guard.MaxHeaderBytes) // fasthttp's read buffer
	}
	for rank := range p.Cfg.DataParallelSize {
		if err := listen(p.Cfg.Port+rank, Handler(p, rank)); err != nil {
			return err
		}
		srv := servers[len(servers)-1]
		p.Servers[p.LocalAddr(rank)] = srv
		// clientconn.Conns (streams and idle connections move to the event
		// loops), under TLS with --secure-proxy (where they do not). No
		// lane at trace level either: every leg is logged (observe.LogLeg).
		var adopter clientconn.Adopter
		if p.Lanes != nil && p.Loops != nil && !p.Guard.Secure() && !p.Tr.UsesTLS(p.LocalAddr(rank)) && !p.LogsLegs() {
			ln := p.Lanes(p, p.LocalAddr(rank), srv, p.Loops.Loops())
			lanes = append(lanes, ln)
			adopter = ln
		}
		lns[len(lns)-1] = p.Guard.WrapListener(clientconn.Listener{Listener: lns[len(lns)-1], Adopter: adopter, Tails: tails})
		p.Log.Info().Int("rank", rank).Int("port", p.Cfg.Port+rank).Str("engine", p.LocalAddr(rank)).Msg("listening")
	}
	if p.Cfg.MetricsPort != 0 {
		if err := listen(p.Cfg.MetricsPort, metricsPortHandler(p)); err != nil { // metricsPortHandler
			return err
		}
	}
	errc := make(chan error, len(servers))
	for i, s := range servers {
		go func() { errc <- s.Serve(lns[i]) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		err = fmt.Errorf("serve: %w", err)
	}
	p.Draining.Store(true)
	p.Log.Info().Str("grace", p.Cfg.ShutdownGrace.String()).Msg("shutting down: draining in-flight requests")
	for _, ln := range lanes {
		ln.Shutdown()
	}
	sctx, cancel := context.WithTimeout(context.Background(), p.Cfg.ShutdownGrace)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, s := range servers {
		wg.Go(func() {
			if e := s.ShutdownWithContext(sctx); e != nil && errors.Is(e, context.DeadlineExceeded) {
				mu.Lock()
				err = errors.Join(err, core.ErrDrainTimeout)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// The requests carried by the event loops are the servers' no more.
	for p.LoopRequests.Load() > 0 && sctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if n := p.LoopRequests.Load(); n > 0 {
		p.Log.Warn().Int64("requests", n).Msg("shutdown grace ran out: closing the requests on the event loops")
		if !errors.Is(err, core.ErrDrainTimeout) {
			err = errors.Join(err, core.ErrDrainTimeout)
		}
	}
	if p.Loops != nil {
		p.Loops.Close() // ends what is left
	}
	// The release legs still in flight, the probes, the warm-ups and the
	// MoRI-IO revalidations, in that order, before the transports close.
	bg.Stop()
	p.Tr.Close()
	if p.EncTr != nil {
		p.EncTr.Close()
	}
	p.Log.Info().Err(err).Msg("stopped")
	return err
}

func newServer(p *inference.Proxy, h fasthttp.RequestHandler) *fasthttp.Server {
	return &fasthttp.Server{
		// Request bodies are reserved from --max-buffered-bytes as their
		// head arrives (guard.BodyHolds).
		Handler:            p.Guard.Bodies().Handler(h),
		HeaderReceived:     p.Guard.Bodies().HeaderReceived,
		Name:               core.ServerName,
		MaxRequestBodySize: p.Cfg.MaxRequestBodyBytes,
		ReadTimeout:        p.Cfg.Guard.ReadTimeout,
		IdleTimeout:        p.Cfg.Guard.IdleTimeout,
		ReadBufferSize:     p.Cfg.Guard.MaxHeaderBytes,
		// Each open stream holds this writer; answers are headers and SSE
		// chunks, flushed one by one, and longer writes bypass it.
		WriteBufferSize: 2 << 10,
		ErrorHandler:    p.ServerError, // JSON 413/431/408/400 (reject)
		CloseOnShutdown: true,
		// An open stream then holds no read buffer (its request was read
		// whole), and an idle keep-alive connection holds no request
		// context either.
		ReduceMemoryUsage:     true,
		NoDefaultServerHeader: true,
		// fasthttp's errors then quote less of a request; fasthttpLogger
		// and serverError quote none of it.
		SecureErrorLogMessage: true,
		Logger:                fasthttpLogger{p},
	}
}

// fasthttpLogger routes fasthttp's own messages to zerolog.
type fasthttpLogger struct{ p *inference.Proxy }

// Printf implements fasthttp.Logger. The end of fasthttp's part in a
// stream handed to an event loop is no error; an error is logged as
// clientconn.LogSafe says it (never with the request's bytes).
func (l fasthttpLogger) Printf(format string, args ...any) {
	for i, a := range args {
		if err, ok := a.(error); ok {
			if errors.Is(err, core.ErrHandedOver) {
				return
			}
			args[i] = clientconn.LogSafe(err)
		}
	}
	l.p.Log.Warn().Msgf(format, args...)
}

// Handler returns the request handler of data-parallel rank r: the same
// proxy, with rank r's local engine as decoder and passthrough target.
func Handler(p *inference.Proxy, rank int) fasthttp.RequestHandler {
	local := p.LocalAddr(rank)
	return func(rc *fasthttp.RequestCtx) {
		clientconn.DropTrailers(&rc.Request.Header) // before anything reads the head
		defer clientconn.Counted(rc)()
		if refuseHead(p, rc) || refuseVersion(p, rc) || refuseTarget(p, rc) { // head, version and target checks
			return
		}
		if serveOwn(p, rc, local) { // /health, /ready, /metrics, /debug/pd
			return
		}
		path := rc.Path()
		if api, ok := connectors.APIForPath(string(path)); ok && rc.IsPost() {
			p.ServeInference(rc, local, api)
			return
		}
		// Before anything is forwarded: the passthrough policy.
		if v := p.Pass.Decide(string(rc.Method()), string(path)); !v.Pass() {
			refusePassthrough(p, rc, v)
			return
		}
		passthrough(p, rc, local)
	}
}

// ready answers 200 when the local engine's /health answers 200 and the
// proxy is not draining.
func ready(p *inference.Proxy, rc *fasthttp.RequestCtx, local string) {
	rc.SetContentType("application/json")
	if p.Draining.Load() {
		rc.SetStatusCode(fasthttp.StatusServiceUnavailable)
		rc.SetBodyString(`{"status":"draining"}`)
		return
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.SetRequestURI("/health")
	req.Header.SetHost(local)
	ctx, cancel := core.ContextWithTimeout(p.Cfg.ConnectTimeout + time.Second)
	defer cancel()
	hold, err := p.Tr.Do(ctx, local, req, resp)
	defer hold.Release()
	if err != nil || resp.StatusCode() != fasthttp.StatusOK {
		rc.SetStatusCode(fasthttp.StatusServiceUnavailable)
		rc.SetBodyString(`{"status":"engine not ready"}`)
		return
	}
	rc.SetBodyString(`{"status":"ready"}`)
}
