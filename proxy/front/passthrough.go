package front

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/dprank"
	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvsource"
	"github.com/pd-sidecar/pd-sidecar/proxy/logvalue"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// maxBuffered is the largest known-length passthrough answer read whole;
// longer or unknown-length answers are streamed.
const maxBuffered = 1 << 20

// passthrough forwards any non-inference request to the local engine
// unchanged (method, path, query, headers but the sidecar's own and one
// X-Request-ID, body) and streams the answer back, flushing as bytes
// arrive.
func passthrough(p *inference.Proxy, rc *fasthttp.RequestCtx, local string) {
	g := p.M.Inflight.WithLabelValues(metrics.PhasePassthrough)
	g.Inc()
	ctx, cancel := context.WithCancelCause(context.Background())
	w := p.Armer.Watch(rc.Conn(), cancel, time.Now())
	req := fasthttp.AcquireRequest()
	rc.Request.Header.CopyTo(&req.Header)
	rawhttp.DelOptions(&req.Header) // the connection options the client's Connection fields name
	for _, h := range core.HopHeaders {
		req.Header.Del(h)
	}
	req.Header.Del(core.HeaderPrefiller)
	req.Header.Del(dprank.Header)
	req.Header.Del(kvsource.Header)
	req.Header.Del(encoder.Header)
	req.Header.Del("Expect")
	// One X-Request-ID, as on every leg: the client's first (when valid),
	// never a second copy (Set replaces only the first).
	id := core.RequestID(rc.Request.Header.Peek(core.HeaderRequestID))
	req.Header.Del(core.HeaderRequestID)
	req.Header.Set(core.HeaderRequestID, id)
	req.Header.SetHost(local)
	if t := clientconn.OriginForm(rc); t != nil {
		req.Header.SetRequestURIBytes(t) // the path routed on
	}
	req.Header.SetProtocolBytes(core.StrHTTP11)
	body, err := readPassthroughBody(p, rc)
	if err != nil {
		fasthttp.ReleaseRequest(req)
		g.Dec()
		if w.Stop() {
			rc.SetConnectionClose()
		}
		cancel(context.Canceled)
		st := failure.Of(err).Status
		p.Log.Warn().Err(err).Str("path", string(rc.Path())).Str("request_id", logvalue.Cut(string(rc.Request.Header.Peek(core.HeaderRequestID)))).
			Int("status", st).Msg("passthrough refused")
		rc.SetStatusCode(st)
		rc.SetContentType("application/json")
		rc.SetBody(core.ErrorBody(st, err))
		return
	}
	req.SetBodyRaw(body)
	resp := fasthttp.AcquireResponse()
	resp.SkipBody = rc.IsHead()
	leg, err := p.Tr.Stream(ctx, local, req, resp)
	fasthttp.ReleaseRequest(req)
	done := func() {
		fasthttp.ReleaseResponse(resp)
		g.Dec()
		if w.Stop() {
			rc.SetConnectionClose()
		}
		cancel(context.Canceled)
	}
	left := func() bool {
		// After done: the watch has stopped, so the cause is final.
		return errors.Is(context.Cause(ctx), core.ErrClientGone) || clientconn.PeerClosed(rc.Conn())
	}
	if err != nil {
		done()
		if left() {
			dropPassthrough(p, rc, id)
			return
		}
		err = core.DecodeTransportErr(err)
		st := failure.Of(err).Status
		upstream.WithUpstream(p.Log.Error().Err(err), err).Str("path", string(rc.Path())).Msg("passthrough failed")
		rc.SetStatusCode(st)
		rc.SetContentType("application/json")
		rc.SetBody(core.ErrorBody(st, err))
		return
	}
	if clientconn.PeerClosed(rc.Conn()) {
		leg.Close()
		done()
		dropPassthrough(p, rc, id)
		return
	}
	inference.CopyResponseHead(rc, resp)
	cl := resp.Header.ContentLength()
	if cl >= 0 && cl <= maxBuffered && !bytes.HasPrefix(resp.Header.ContentType(), core.EventStream) {
		body, err := io.ReadAll(leg)
		leg.Close()
		done()
		if err != nil && left() {
			rc.Response.Reset()
			dropPassthrough(p, rc, id)
			return
		}
		if err != nil {
			err = core.DecodeTransportErr(&upstream.LegError{Addr: local, Op: "read", Err: err})
			st := failure.Of(err).Status
			upstream.WithUpstream(p.Log.Error().Err(err), err).Str("path", string(rc.Path())).Msg("passthrough failed")
			rc.Response.Reset()
			rc.SetStatusCode(st)
			rc.SetContentType("application/json")
			rc.SetBody(core.ErrorBody(st, err))
			return
		}
		rc.SetBody(body)
		return
	}
	// fasthttp's server goroutine copies the leg to the client, one flushed
	// chunk per read, and closes it when done or when the client is gone
	// (the next write fails: the watch ends here).
	if w.Stop() {
		rc.SetConnectionClose()
	}
	relay.SetStream(rc, &passthroughBody{leg: leg, done: func() { // in a framing the client reads
		leg.Close()
		done()
	}})
}

// dropPassthrough ends a passthrough request whose client left before its
// answer (a FIN or a reset while the engine answered, seen by the watch or
// by clientconn.PeerClosed): nothing is written, not even an error, as to
// an inference request's client (Request.LeftNow), and the connection
// closes.
func dropPassthrough(p *inference.Proxy, rc *fasthttp.RequestCtx, id string) {
	p.M.ClientDisconnects.WithLabelValues(metrics.PhasePassthrough).Inc()
	p.Log.Info().Str("path", string(rc.Path())).Str("request_id", logvalue.Cut(id)).Msg("client left; passthrough answer dropped")
	rc.HijackSetNoResponse(true)
	rc.Hijack(func(net.Conn) {})
}

// passthroughBody streams an upstream body to the client as it arrives.
type passthroughBody struct {
	leg  *upstream.Leg
	done func()
}

// Read implements io.Reader.
func (b *passthroughBody) Read(p []byte) (int, error) { return b.leg.Read(p) }

// Close implements io.Closer; fasthttp calls it once the body is written or
// the client write failed.
func (b *passthroughBody) Close() error {
	if b.done != nil {
		b.done()
		b.done = nil
	}
	return nil
}

// passthroughBody is the body of a passthrough request as it may reach the
// engine: a JSON object body loses the client's own connector fields
// (sanitize.Cleaner) on every path, for engines read them on more paths
// than the sidecar splits (SGLang's /generate, vLLM's other APIs); any
// other body (none, multipart, text) is forwarded as is.
func readPassthroughBody(p *inference.Proxy, rc *fasthttp.RequestCtx) ([]byte, error) {
	body := rc.PostBody()
	if !connectors.IsObject(body) {
		return body, nil
	}
	api, _ := connectors.APIForPath(string(rc.Path()))
	body, _, err := p.Clean.Clean(api, body, func() *zerolog.Event {
		return p.Log.Debug().Str("path", string(rc.Path())).Str("request_id", logvalue.Cut(string(rc.Request.Header.Peek(core.HeaderRequestID))))
	})
	return body, err
}
