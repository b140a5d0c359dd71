package inference

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// maxHeld bounds the preamble events held back while waiting for the first
// output of a decode leg.
const MaxHeld = 64 << 10

var EventStream = []byte("text/event-stream")

// forward sends body to the local engine and relays its answer. remote
// marks the decode leg carrying r.handoff: its answer gets the cached-token
// rewrite, and a KV load failure reported before any output is returned as
// ErrKVLoadFailed. forward returns nil once the answer is written or
// streaming; an error only while the client has seen nothing.
func (r *Request) Forward(body []byte, remote bool) error {
	phase := metrics.PhaseLocal
	if remote {
		phase = metrics.PhaseDecode
	}
	g := r.P.M.Inflight.WithLabelValues(phase)
	g.Inc()
	r.DecodeStarted(remote)
	req := r.Upstream(r.Local, body)
	resp := fasthttp.AcquireResponse()
	sent := time.Now()
	var leg *upstream.Leg
	var err error
	if r.Stream && r.P.Cfg.DecodeFirstByteTimeout > 0 {
		// Bound the wait for the beginning of a streamed answer (relaySSE
		// ends it); the stream itself, once begun, has no total timeout.
		leg, err = r.P.Tr.StreamFirstByteTimeout(r.Ctx, r.Local, req, resp, r.P.Cfg.DecodeFirstByteTimeout)
		if errors.Is(err, upstream.ErrFirstByteTimeout) {
			err = fmt.Errorf("%w: %w", ErrDecodeTimeout, err)
		}
	} else {
		leg, err = r.P.Tr.Stream(r.Ctx, r.Local, req, resp)
	}
	fasthttp.ReleaseRequest(req)
	if err != nil {
		g.Dec()
		fasthttp.ReleaseResponse(resp)
		return DecodeTransportErr(err)
	}
	if bytes.HasPrefix(resp.Header.ContentType(), EventStream) && !upstream.Bodiless(resp.StatusCode()) {
		return r.relaySSE(leg, resp, g, remote, sent)
	}
	defer g.Dec()
	defer fasthttp.ReleaseResponse(resp)
	return r.relayJSON(leg, resp, remote, sent)
}

func (r *Request) relayJSON(leg *upstream.Leg, resp *fasthttp.Response, remote bool, sent time.Time) error {
	buf, hold, err := leg.ReadAll(r.P.Cfg.MaxUpstreamAnswerBytes)
	// buf is let go on return: what the client is written is rc's copy.
	defer hold.Release()
	leg.Close()
	if err != nil {
		return DecodeTransportErr(err)
	}
	st := resp.StatusCode()
	if remote {
		r.KvHandoffDone(sent, st == fasthttp.StatusOK)
		if st == fasthttp.StatusInternalServerError && r.KvLoadFailed() {
			return ErrKVLoadFailed
		}
		if st == fasthttp.StatusOK && r.P.Rewriter != nil {
			buf = r.P.Rewriter.RewriteAnswer(r.Api, buf, *r.Handoff)
		}
	}
	if r.LeftNow() {
		return ErrClientGone
	}
	r.CopyHead(resp)
	r.Rc.SetBody(buf)
	r.JsonAnswered(st)
	return nil
}

// jsonAnswered records a JSON answer of status st relayed whole, as both
// the fasthttp path and the lane relay one.
func (r *Request) JsonAnswered(st int) {
	r.P.M.TTFT.WithLabelValues(r.Mode).Observe(time.Since(r.Start).Seconds())
	r.P.M.Requests.WithLabelValues(r.Mode, StatusLabel(st)).Inc()
	r.Obs.Status = st
	r.LogAt(zerolog.InfoLevel).Str("mode", r.Mode).Int("status", st).Msg("answered")
}

// kvLoadFailed counts a KV load failure of the decode leg and reports
// whether the request is to be re-run with a local prefill.
func (r *Request) KvLoadFailed() bool {
	r.P.M.KVLoadFailures.WithLabelValues(r.Label).Inc()
	if r.P.Cfg.OnKVLoadFailure == KVFailError {
		r.LogAt(zerolog.ErrorLevel).Msg("decode engine failed to load the remote KV; error passed on (--on-kv-load-failure error)")
		return false
	}
	return true
}

// copyHead copies the upstream status and end-to-end headers to the client.
func (r *Request) CopyHead(resp *fasthttp.Response) {
	copyResponseHead(r.Rc, resp)
	r.Rc.Response.Header.Set(HeaderRequestID, r.Id)
}

func copyResponseHead(rc *fasthttp.RequestCtx, resp *fasthttp.Response) {
	resp.Header.CopyTo(&rc.Response.Header)
	// The status line is the sidecar's, HTTP/1.1 as in every answer it
	// makes (an HTTP/1.0 client gets framing it reads: setStream),
	// never the upstream's version.
	rc.Response.Header.SetProtocol(nil)
	for _, h := range hopHeaders {
		rc.Response.Header.Del(h)
	}
}

// relaySSE streams an SSE answer event by event. On the decode leg the
// events that carry no output yet (the role chunk) are held back until the
// first output or error: an error there is a KV load failure, recoverable
// because the client has seen nothing.
func (r *Request) relaySSE(leg *upstream.Leg, resp *fasthttp.Response, g prometheus.Gauge, remote bool, sent time.Time) error {
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
			return abort(BeforeOutputErr(EndedEarly(r.Local, "any event", err)))
		}
		held = append(held, ev...)
	} else {
		var kvFail bool
		var err error
		// The role chunk and the first output, usually.
		if held, kvFail, err = ReadToOutput(er, r.Api, make([]byte, 0, 2<<10)); err != nil {
			return abort(BeforeOutputErr(EndedEarly(r.Local, "any output", err)))
		}
		r.KvHandoffDone(sent, !kvFail)
		if kvFail && r.KvLoadFailed() {
			return abort(ErrKVLoadFailed)
		}
	}
	if r.LeftNow() {
		return abort(ErrClientGone)
	}
	leg.Began()
	r.CopyHead(resp)
	r.P.M.Requests.WithLabelValues(r.Mode, StatusLabel(resp.StatusCode())).Inc()
	r.Obs.Status = resp.StatusCode()
	r.StreamBody(r.NewSSEBody(er, leg, held, remote, func() {
		er.Release()
		leg.Close()
		fasthttp.ReleaseResponse(resp)
		g.Dec()
		r.Finish()
	}))
	return nil
}

// beforeOutputErr is the error of a stream that ended, or was cut by
// --decode-first-byte-timeout, before it had anything to relay.
func BeforeOutputErr(err error) error { return DecodeTransportErr(err) }

// needsDone reports whether api's streams end with data: [DONE].
func needsDone(api connectors.API) bool {
	return api == connectors.APIChat || api == connectors.APICompletions
}

// left records a client that went away mid-stream.
func (r *Request) left() {
	r.LogAt(zerolog.InfoLevel).Msg("client left mid-stream; upstream leg cancelled")
	r.P.M.ClientDisconnects.WithLabelValues(r.phase()).Inc()
}

// streamBody hands b to fasthttp as the answer's body. From here a client
// that leaves fails the next write, so no watcher is kept for the life of
// the stream.
func (r *Request) StreamBody(b *sseBody) {
	if r.watch.Stop() {
		r.Rc.SetConnectionClose()
	}
	r.detached = true
	setStream(r.Rc, b) // the framing the client reads
}

// readToOutput reads a stream's events, appended to held, up to its first
// output or error event (error reports the latter), or maxHeld bytes of
// preamble.
func ReadToOutput(er *sse.Reader, api connectors.API, held []byte) ([]byte, bool, error) {
	for {
		ev, err := er.Next()
		if err != nil {
			return held, false, err
		}
		held = append(held, ev...)
		kind := connectors.EventPreamble
		if d := sse.FirstData(ev); d != nil {
			kind = connectors.ClassifyEvent(api, d)
		}
		if kind == connectors.EventPreamble && len(held) < MaxHeld {
			continue
		}
		return held, kind == connectors.EventError, nil
	}
}
