// Package inference composes a sidecar: its request core (proxy/core: the
// shared state, every request's state and decisions) with the drivers that
// serve requests — fasthttp's goroutine driver (proxy/godriver, through
// the GoDriver it registers) and the lane (proxy/lane, through LaneFunc) —
// the event loops that carry open streams, and what only fasthttp's path
// writes: a request refused before it is one, and its metrics route.
package inference

import (
	"context"
	"sync/atomic"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/netloop"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/engineinfo"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvpull"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Proxy is a sidecar: its request core and its drivers. Create it with
// New.
type Proxy struct {
	*core.Sidecar
	// Armer arms the client connections' watches (clientconn.Watch).
	Armer *clientconn.Armer
	// MetricsH serves /metrics.
	MetricsH fasthttp.RequestHandler
	// Debug serves GET /debug/pd (nil: the path goes to the local engine).
	Debug fasthttp.RequestHandler
	// Loops carry open streams (relay.LoopStream); nil: each stream keeps
	// its goroutine. Servers are the servers of the local engines' ports,
	// by engine address, which take a connection back after its stream.
	// Both are set by Run before it serves.
	Loops        *netloop.Group
	Servers      map[string]*fasthttp.Server
	LoopRequests atomic.Int64 // requests on the loops: streams handed over, and the lane's
	// Lanes starts the lane of a local engine's port (UseLanes); nil:
	// fasthttp serves every request.
	Lanes LaneFunc
	// goDriver serves the inference requests fasthttp's handler
	// goroutine serves (UseGoDriver).
	goDriver GoDriver
	// engine watches the local engine's version (engineinfo).
	engine *engineinfo.Watcher
}

// GoDriver serves inference request rc, arrived for the local engine
// local on a path of api, on fasthttp's handler goroutine, and answers
// the client (proxy/godriver).
type GoDriver func(p *Proxy, rc *fasthttp.RequestCtx, local string, api connectors.API)

// UseGoDriver makes f serve the inference requests fasthttp's handler
// serves. New's caller must call it before Run.
func (p *Proxy) UseGoDriver(f GoDriver) { p.goDriver = f }

// LegStart is the start of a leg's head from the client's head h and the
// path routed on, target: what every leg of the request begins with on the
// lane, and a release leg on either path (rawhttp.AppendLegStartAt).
func (p *Proxy) LegStart(h *fasthttp.RequestHeader, target []byte) []byte {
	return rawhttp.AppendLegStartAt(nil, h, target, p.LegStrip)
}

// Lane is the event-loop driver of one local engine's port (proxy/lane):
// it adopts the client connections the listener hands over between
// requests and serves what it can of their requests on the loops.
type Lane interface {
	clientconn.Adopter
	// Shutdown closes the idle connections and makes the others close
	// after their answer.
	Shutdown()
}

// LaneFunc starts the lane of the local engine at local, whose fasthttp
// server srv takes back the connections the lane does not serve.
type LaneFunc func(p *Proxy, local string, srv *fasthttp.Server, loops []*netloop.Loop) Lane

// UseLanes makes Run start a lane with f on every local engine's port
// where the event loops run (--stream-loops) and the connection is plain.
func (p *Proxy) UseLanes(f LaneFunc) { p.Lanes = f }

// New returns a Proxy. cfg must be valid (see core.Config.Validate); m
// holds the collectors, gatherer is what /metrics exports, log receives
// JSON logs.
func New(cfg core.Config, conn connectors.Connector, m *metrics.Metrics, gatherer prometheus.Gatherer, log zerolog.Logger) (*Proxy, error) {
	s, err := core.NewSidecar(cfg, conn, m, log)
	if err != nil {
		return nil, err
	}
	p := &Proxy{Sidecar: s, Armer: clientconn.NewArmer(clientconn.WatchDelay, core.ErrClientGone),
		MetricsH: fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))}
	if p.EncTr, err = newEncoderTransport(cfg); err != nil {
		return nil, err
	}
	if enc := newEncoderStage(p); enc != nil {
		p.AddAdmitter(enc) // last: it reads the body as the others left it
	}
	if cfg.EngineInfoInterval > 0 {
		p.engine = newEngineInfo(p)
		p.AddBackground(p.engine)
	}
	return p, nil
}

// ConnDone passes on a client connection whose answer an event loop
// finished: to its next request (keep), on the lane or else (no lane, or
// the answer was a P/D one the lane does not serve: Conn.NextAdopter)
// fasthttp's server of engine local; or closed.
func (p *Proxy) ConnDone(cc *clientconn.Conn, local string, keep bool) {
	a := cc.NextAdopter()
	switch {
	case !keep:
		_ = cc.TCPConn.Close()
	case a != nil:
		a.Adopt(cc)
	default:
		srv := p.Servers[local]
		go func() { _ = srv.ServeConn(cc) }()
	}
}

// SetExtras installs optional collaborators. Call it before Run.
func (p *Proxy) SetExtras(e Extras) {
	p.Debug = e.Debug
	p.Observe(e.Observer, e.Tracer, e.Propagator)
}

// Extras are the optional collaborators of a Proxy; the zero value has none.
type Extras struct {
	// Observer is told how each inference request ended (nil: nobody).
	Observer core.Observer
	// Debug serves GET /debug/pd (nil: the path goes to the local engine).
	Debug fasthttp.RequestHandler
	// Tracer starts the request, prefill, kv_handoff and decode spans (nil:
	// no spans, and an incoming traceparent is passed on untouched).
	Tracer trace.Tracer
	// Propagator reads the incoming trace context and writes it on both
	// legs (nil: W3C trace context).
	Propagator propagation.TextMapPropagator
}

// EnableKVPull makes the sidecar pull the KV itself between prefill and
// decode (core.Sidecar.EnableKVPull), calling the local engine over the
// sidecar's transport. Call it before Run.
func (p *Proxy) EnableKVPull(cfg kvpull.Config, puller *kvtransfer.Puller, m *metrics.KVPull) error {
	return p.Sidecar.EnableKVPull(cfg, puller, m, engineCaller(p.Tr))
}

// engineCaller is the core.EngineCall that POSTs a JSON body to path on
// the local engine local, under the request id id, over tr: the answer's
// body and status (kvpull.Feature.Call).
func engineCaller(tr *upstream.Transport) core.EngineCall {
	return func(ctx context.Context, local, id, path string, body []byte) ([]byte, int, error) {
		return engineCall(ctx, tr, local, id, path, body)
	}
}

func engineCall(ctx context.Context, tr *upstream.Transport, local, id, path string, body []byte) ([]byte, int, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(path)
	req.Header.SetHost(local)
	req.Header.SetContentType("application/json")
	req.Header.Set(core.HeaderRequestID, id)
	req.SetBodyRaw(body)
	hold, err := tr.Do(ctx, local, req, resp)
	defer hold.Release() // resp is let go on return; the copy returned is small JSON
	if err != nil {
		return nil, 0, err
	}
	return append([]byte(nil), resp.Body()...), resp.StatusCode(), nil
}
