// Package relay writes an engine's answer to the client: a JSON answer
// whole, an SSE stream event by event (the decode leg's events held back
// until its first output, so that a KV load failure can still be re-run),
// chunked decode's legs as one answer, and an open stream handed to an
// event loop (LoopStream), which the lane's own streams use too. Both
// drivers relay through it, so a stream's bounds and its end are the same
// on either path.
package relay

import (
	"bytes"
	"context"
	"io"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Forward sends body to the local engine and relays its answer. remote
// marks the decode leg carrying r.R.Handoff: its answer gets the cached-token
// rewrite, and a KV load failure reported before any output is returned
// for the split to recover from (Request.KVAnswered). Forward returns nil once the answer is written or
// streaming; an error only while the client has seen nothing.
func Forward(r *Exchange, body []byte, remote bool) error {
	phase := metrics.PhaseLocal
	if remote {
		phase = metrics.PhaseDecode
	}
	g := r.R.P.M.Inflight.WithLabelValues(phase)
	g.Inc()
	r.R.DecodeStarted(remote)
	req := r.Upstream(r.R.Local, body)
	resp := fasthttp.AcquireResponse()
	sent := time.Now()
	leg, err := OpenLeg(r.R.Ctx, r, req, resp)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		g.Dec()
		fasthttp.ReleaseResponse(resp)
		return core.DecodeTransportErr(err)
	}
	if bytes.HasPrefix(resp.Header.ContentType(), core.EventStream) && !upstream.Bodiless(resp.StatusCode()) {
		return relaySSE(r, leg, resp, g, remote, sent)
	}
	defer g.Dec()
	defer fasthttp.ReleaseResponse(resp)
	return relayJSON(r, leg, resp, remote, sent)
}

// OpenLeg sends req to the local engine within ctx and reads its answer's
// head into resp, the wait for the beginning of a streamed answer bounded
// as the request says (Request.FirstByteBound; the caller's Leg.Began ends
// the bound: a stream, once begun, has no total timeout).
func OpenLeg(ctx context.Context, r *Exchange, req *fasthttp.Request, resp *fasthttp.Response) (*upstream.Leg, error) {
	if d := r.R.FirstByteBound(); d > 0 {
		return r.R.P.Tr.StreamFirstByteTimeout(ctx, r.R.Local, req, resp, d)
	}
	return r.R.P.Tr.Stream(ctx, r.R.Local, req, resp)
}

func relayJSON(r *Exchange, leg *upstream.Leg, resp *fasthttp.Response, remote bool, sent time.Time) error {
	buf, hold, err := leg.ReadAll(r.R.P.Cfg.MaxUpstreamAnswerBytes)
	// buf is let go on return: what the client is written is rc's copy.
	defer hold.Release()
	leg.Close()
	if err != nil {
		return core.DecodeTransportErr(err)
	}
	st := resp.StatusCode()
	if remote {
		if err := r.R.KVAnswered(sent, st); err != nil {
			return err
		}
		buf = r.R.AnswerBody(st, buf)
	} else {
		buf = r.R.LocalAnswerBody(st, buf)
	}
	if r.LeftNow() {
		return core.ErrClientGone
	}
	r.CopyHead(resp)
	r.RC.SetBody(buf)
	r.R.JSONAnswered(st)
	return nil
}

// relaySSE streams an SSE answer event by event. On the decode leg the
// events that carry no output yet (the role chunk) are held back until the
// first output or error: an error there is a KV load failure, recoverable
// because the client has seen nothing.
func relaySSE(r *Exchange, leg *upstream.Leg, resp *fasthttp.Response, g prometheus.Gauge, remote bool, sent time.Time) error {
	er := r.EventReader(leg)
	var held []byte
	abort := func(err error) error {
		er.Release()
		leg.Close()
		fasthttp.ReleaseResponse(resp)
		g.Dec()
		return err
	}
	// The answer's head waits for the stream's first event (for a decode
	// on remote KV, its first output): the client then sees an error status,
	// not a 200 and an error event, when the engine sends its head and
	// nothing more (within --decode-first-byte-timeout) or breaks off.
	if !remote {
		ev, err := er.Next()
		if err != nil {
			return abort(core.EndedBefore(r.R.Local, "any event", err))
		}
		held = append(held, ev...)
	} else {
		var kvFail bool
		var err error
		// The role chunk and the first output, usually.
		if held, kvFail, err = core.ReadToOutput(er, r.R.API, make([]byte, 0, 2<<10)); err != nil {
			return abort(core.EndedBefore(r.R.Local, "any output", err))
		}
		if err := r.R.KVStreamed(sent, kvFail); err != nil {
			return abort(err)
		}
	}
	if r.LeftNow() {
		return abort(core.ErrClientGone)
	}
	leg.Began()
	r.CopyHead(resp)
	r.R.StreamBegan(resp.StatusCode())
	StreamBody(r, NewSSEBody(r, er, leg, held, remote, func() {
		er.Release()
		leg.Close()
		fasthttp.ReleaseResponse(resp)
		g.Dec()
		r.Finish()
	}))
	return nil
}

// needsDone reports whether api's streams end with data: [DONE].
func needsDone(api connectors.API) bool {
	return api == connectors.APIChat || api == connectors.APICompletions
}

// Left records a client that went away mid-stream.
func Left(r *core.Request) {
	r.LogAt(zerolog.InfoLevel).Msg("client left mid-stream; upstream leg cancelled")
	r.P.M.ClientDisconnects.WithLabelValues(r.Phase()).Inc()
}

// StreamBody hands b to fasthttp as the answer's body. From here a client
// that leaves fails the next write, so no watcher is kept for the life of
// the stream.
func StreamBody(r *Exchange, b *sseBody) {
	if r.Watch.Stop() {
		r.RC.SetConnectionClose()
	}
	r.R.Detached = true
	SetStream(r.RC, b) // the framing the client reads
}

// SetStream makes body the answer of rc, streamed: chunked to an HTTP/1.1
// client (fasthttp writes each Read as a flushed chunk); to an HTTP/1.0
// client, which cannot read chunked framing, close-delimited — no
// Content-Length, no Transfer-Encoding, Connection: close — written on the
// hijacked connection (each Read, or each write of body's WriteTo, goes
// out as it comes), which closes after it. body is closed once written, or
// once the client is gone, as fasthttp closes a body stream.
func SetStream(rc *fasthttp.RequestCtx, body io.Reader) {
	if rc.Request.Header.IsHTTP11() {
		rc.SetBodyStream(body, -1)
		return
	}
	h := &rc.Response.Header
	h.SetServer(core.ServerName)
	h.SetConnectionClose()
	h.SetContentLength(-1)                 // no Content-Length ...
	h.Del(fasthttp.HeaderTransferEncoding) // ... and no Transfer-Encoding
	head := h.AppendBytes(nil)
	headOnly := rc.IsHead()
	rc.HijackSetNoResponse(true)
	rc.Hijack(func(c net.Conn) {
		if c, ok := body.(io.Closer); ok {
			defer c.Close()
		}
		if _, err := c.Write(head); err != nil || headOnly {
			return
		}
		_, _ = io.Copy(c, body)
	})
}
