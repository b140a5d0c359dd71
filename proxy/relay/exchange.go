package relay

import (
	"errors"
	"net"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/observe"
	"github.com/pd-sidecar/pd-sidecar/proxy/prefillstrip"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Exchange is a request on fasthttp's path: the request's state, and the
// client exchange it is answered on (fasthttp's RequestCtx, and the watch
// of its connection while nothing is written). Answering, failing and
// passing on a rejection are done here, fasthttp's way, as the lane does
// them on its connection; what the answer is (its status, its body, what
// is counted and logged) is the request's.
type Exchange struct {
	R     *core.Request        // the request answered
	P     *inference.Proxy     // the sidecar serving it: its loops, watches, servers
	RC    *fasthttp.RequestCtx // the client exchange it is answered on
	Watch *clientconn.Watch    // the client connection's watch
}

// NewExchange begins request rc, arrived for the local engine local on
// an inference path of api: the request's state, its X-Request-ID on the
// answer, and the watch of its client connection.
func NewExchange(p *inference.Proxy, rc *fasthttp.RequestCtx, local string, api connectors.API) *Exchange {
	r := p.StartRequest(core.Arrival{ID: rc.Request.Header.Peek(core.HeaderRequestID), Head: &rc.Request.Header,
		Body: rc.PostBody(), Local: local, API: api, Client: clientconn.PeerAddr(rc.RemoteAddr())})
	rc.Response.Header.Set(core.HeaderRequestID, r.ID)
	return &Exchange{R: r, P: p, RC: rc, Watch: p.Armer.Watch(rc.Conn(), r.Cancel, r.Start)}
}

// Finish ends the request's bookkeeping; the last owner calls it. A
// handoff still pending a read is released first (--release-kv-on-cancel),
// on a leg whose head is the client's.
func (x *Exchange) Finish() {
	if x.R.KVPending != nil {
		target := clientconn.OriginForm(x.RC) // the path routed on
		if target == nil {
			target = x.RC.Request.Header.RequestURI()
		}
		core.ReleaseKV(x.R, x.P.LegStart(&x.RC.Request.Header, target))
	}
	stopped := x.Watch.Stop()
	x.R.Finish()
	if stopped && !x.R.Detached {
		x.RC.SetConnectionClose()
	}
}

// Upstream builds a leg to addr carrying body: the client's head, as the
// request's legs carry it (legHeader), to the path routed on.
func (x *Exchange) Upstream(addr string, body []byte) *fasthttp.Request {
	return x.leg(addr, body, false)
}

// PrefillRequest builds a leg to the prefiller carrying body, as Upstream
// builds every leg, less --prefill-strip-headers, with the rank the legs
// were paired on.
func (x *Exchange) PrefillRequest(body []byte) *fasthttp.Request {
	return x.leg(x.R.Prefiller, body, true)
}

func (x *Exchange) leg(addr string, body []byte, prefill bool) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	spec := x.R.Legs()
	legHeader(&req.Header, &x.RC.Request.Header, addr, spec)
	if prefill {
		prefillHeader(&req.Header, spec, x.R.P.PrefillStrips())
	}
	if t := clientconn.OriginForm(x.RC); t != nil {
		req.Header.SetRequestURIBytes(t) // the path routed on
	}
	req.SetBodyRaw(body)
	observe.LogLeg(x.R.LogAt(zerolog.TraceLevel), addr, req)
	return req
}

// legHeader sets dst to the head of a leg to addr: the client's head src
// minus hop-by-hop headers (the connection options its Connection fields
// name too) and the sidecar's, with what spec adds: our X-Request-ID, the
// rank, the trace context. The lane writes the same head
// (rawhttp.AppendLegStart, core.LegSpec.AppendTo).
func legHeader(dst, src *fasthttp.RequestHeader, addr string, spec core.LegSpec) {
	src.CopyTo(dst)
	rawhttp.DelOptions(dst)
	for _, h := range core.HopHeaders {
		dst.Del(h)
	}
	for _, h := range core.SidecarHeaders {
		dst.Del(h)
	}
	if spec.Session != "" {
		dst.Del(spec.Session) // the session key is the sidecar's, every copy
	}
	dst.Del(core.HeaderRequestID) // every copy: Set replaces only the first
	dst.Set(core.HeaderRequestID, spec.ID)
	if spec.DropRank {
		dst.Del(moriio.HeaderRank)
	}
	if spec.Rank != "" {
		dst.Set(moriio.HeaderRank, spec.Rank)
	}
	if spec.Trace != nil {
		spec.Trace.Inject(dst)
	}
	dst.SetHost(addr)
	dst.SetProtocolBytes(core.StrHTTP11) // whatever the client's (SetStream)
}

// prefillHeader sets on a prefill leg's head what it alone carries: less
// the headers named in strip (--prefill-strip-headers, lower case), the
// rank the legs were paired on, the client's own left out.
func prefillHeader(h *fasthttp.RequestHeader, spec core.LegSpec, strip []string) {
	prefillstrip.Strip(h, strip)
	if spec.RankPrefill {
		h.Del(moriio.HeaderRank) // every copy: the client's is not the pairing's
		if spec.PrefillRank != "" {
			h.Set(moriio.HeaderRank, spec.PrefillRank)
		}
	}
}

// CopyHead copies the upstream status and end-to-end headers to the
// client.
func (x *Exchange) CopyHead(resp *fasthttp.Response) {
	inference.CopyResponseHead(x.RC, resp)
	x.RC.Response.Header.Set(core.HeaderRequestID, x.R.ID)
}

// Answer writes a complete, non-streamed answer, unless the client left.
func (x *Exchange) Answer(mode string, status int, contentType string, body []byte) {
	if x.LeftNow() {
		x.LeftBeforeAnswer(core.ErrClientGone)
		return
	}
	rc := x.RC
	rc.SetStatusCode(status)
	rc.SetContentType(contentType)
	rc.SetBody(body)
	x.R.AnswerCounted(mode, status)
}

// Fail answers a request that could not be served with the request's
// answer to its failure (Request.Failure), unless the answer has already
// started (err nil) or the client left.
func (x *Exchange) Fail(err error) {
	if err == nil {
		return
	}
	if errors.Is(err, core.ErrClientGone) || x.LeftNow() {
		x.LeftBeforeAnswer(err)
		return
	}
	a := x.R.Failure(err)
	x.Answer(x.R.Mode, a.Status, "application/json", a.Body)
	if a.RetryAfter {
		x.RC.Response.Header.Set("Retry-After", "1")
	}
}

// PassOn answers with the prefiller's rejection of the request, err, as
// it came (Request.Rejection), or fails it when err is no rejection.
func (x *Exchange) PassOn(err error) {
	rej := x.R.Rejection(err)
	if rej == nil {
		x.Fail(err)
		return
	}
	x.Answer(metrics.ModeDisaggregated, rej.Status, rej.ContentType, rej.Body)
}

// LeftBeforeAnswer records a client that left before its answer began
// (Request.LeftBeforeAnswer), and closes its connection with nothing
// written: fasthttp would otherwise write the untouched response, an
// empty 200.
func (x *Exchange) LeftBeforeAnswer(err error) {
	x.R.LeftBeforeAnswer(err)
	if !x.R.Detached {
		x.RC.HijackSetNoResponse(true)
		x.RC.Hijack(func(net.Conn) {}) // fasthttp closes the connection after it
	}
}

// A client that shuts its side of the connection before its answer is
// taken as gone, on both paths (docs/security.md, "Half-closed clients"):
// nothing is written, the request counts 499. The lane's event loop sees
// the FIN (a hang-up) while the request waits; fasthttp's path has its
// clientconn.Watch, armed only after clientconn.WatchDelay, so an answer
// that comes sooner is checked for the FIN before it is written
// (LeftNow).

// LeftNow reports whether the client left before its answer began: the
// watch saw it, or it half-closed (or reset) the connection since
// (clientconn.PeerClosed), in which case the request is cancelled as the
// watch would have. The caller answers nothing then (the request ends as
// LeftBeforeAnswer ends it).
func (x *Exchange) LeftNow() bool {
	switch {
	case x.R.Gone():
		return true
	case x.R.Detached:
		return false
	case clientconn.PeerClosed(x.RC.Conn()):
		x.R.Cancel(core.ErrClientGone)
		return true
	}
	return false
}

// EventReader reads the local engine's stream on leg, bounded by
// --max-sse-event-bytes, a refusal counted (Request.EventRefused).
func (x *Exchange) EventReader(leg *upstream.Leg) *sse.Reader {
	er := sse.NewReader(leg, &x.R.P.Bufs, x.R.P.Cfg.MaxSSEEventBytes)
	er.Refused = x.R.EventRefused
	return er
}
