package proxy

import (
	"bytes"
	"errors"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Outcomes of a decode-first attempt (pd_sidecar_decode_first_total).
const (
	// DecodeFirstServed: the decode engine answered from its own cache; no
	// prefill ran.
	DecodeFirstServed = "served"
	// DecodeFirstDeclined: the decode engine declined (cache_threshold); the
	// sequential handoff ran.
	DecodeFirstDeclined = "declined"
)

// serveDecodeFirst tries the request on the decode engine first when the
// connector selects it. It reports whether the request was answered; false
// means it was not tried, or was declined, and the sequential handoff runs
// with r.body replaced by the connector's AfterDecline body (so a local
// fallback cannot be declined again).
func (r *request) serveDecodeFirst(df connectors.DecodeFirst) bool {
	if !df.TryDecodeFirst(r.api, r.body) {
		return false
	}
	declined, err := r.tryDecode(df)
	if err != nil {
		r.fail(err)
		return true
	}
	if !declined {
		r.p.m.DecodeFirst.WithLabelValues(DecodeFirstServed).Inc()
		return true
	}
	r.p.m.DecodeFirst.WithLabelValues(DecodeFirstDeclined).Inc()
	body, err := df.AfterDecline(nil, r.api, r.body)
	if err != nil {
		r.fail(err)
		return true
	}
	r.body = body
	r.logAt(zerolog.InfoLevel).Msg("decode engine declined (cache_threshold): prefill on the prefiller, then decode")
	return false
}

// tryDecode sends the client body to the local engine and inspects the
// answer: a JSON answer whole, an SSE answer up to its first output event.
// A declined answer is dropped (declined true); any other is relayed to the
// client as the local engine's answer.
func (r *request) tryDecode(df connectors.DecodeFirst) (declined bool, err error) {
	g := r.p.m.Inflight.WithLabelValues(metrics.PhaseLocal)
	g.Inc()
	req := r.upstream(r.local, r.body)
	resp := fasthttp.AcquireResponse()
	var leg *upstream.Leg
	if r.stream && r.p.cfg.DecodeFirstByteTimeout > 0 {
		leg, err = r.p.tr.StreamFirstByteTimeout(r.ctx, r.local, req, resp, r.p.cfg.DecodeFirstByteTimeout)
	} else {
		leg, err = r.p.tr.Stream(r.ctx, r.local, req, resp)
	}
	fasthttp.ReleaseRequest(req)
	if err != nil {
		g.Dec()
		fasthttp.ReleaseResponse(resp)
		return false, beforeOutputErr(err)
	}
	if !bytes.HasPrefix(resp.Header.ContentType(), eventStream) {
		defer g.Dec()
		defer fasthttp.ReleaseResponse(resp)
		buf, hold, err := leg.ReadAll(r.p.cfg.MaxUpstreamAnswerBytes)
		defer hold.Release() // buf is let go on return (rc keeps a copy)
		leg.Close()
		if err != nil {
			return false, decodeTransportErr(err)
		}
		st := resp.StatusCode()
		if st == fasthttp.StatusOK && df.Declined(r.api, buf) {
			return true, nil
		}
		if r.leftNow() {
			return false, ErrClientGone
		}
		r.copyHead(resp)
		r.rc.SetBody(buf)
		r.p.m.TTFT.WithLabelValues(r.mode).Observe(time.Since(r.start).Seconds())
		r.p.m.Requests.WithLabelValues(r.mode, statusLabel(st)).Inc()
		r.obs.Status = st
		r.logAt(zerolog.InfoLevel).Str("mode", r.mode).Int("status", st).Msg("answered by the decode engine first")
		return false, nil
	}
	return r.tryDecodeSSE(df, leg, resp, g)
}

// tryDecodeSSE reads events up to the first that carries output (or is
// known to decline); a declined stream is closed, any other is relayed from
// its first event on.
func (r *request) tryDecodeSSE(df connectors.DecodeFirst, leg *upstream.Leg, resp *fasthttp.Response, g prometheus.Gauge) (bool, error) {
	er := r.eventReader(leg)
	var held []byte
	for {
		ev, err := er.Next()
		if errors.Is(err, io.EOF) && len(held) > 0 {
			break // a short stream: relay what came
		}
		if err != nil {
			er.Release()
			leg.Close()
			fasthttp.ReleaseResponse(resp)
			g.Dec()
			return false, beforeOutputErr(err)
		}
		held = append(held, ev...)
		d := sse.FirstData(ev)
		if d != nil && df.Declined(r.api, d) {
			er.Release()
			leg.Close()
			fasthttp.ReleaseResponse(resp)
			g.Dec()
			return true, nil
		}
		if (d == nil || connectors.ClassifyEvent(r.api, d) == connectors.EventPreamble) && len(held) < maxHeld {
			continue
		}
		break
	}
	if r.leftNow() {
		er.Release()
		leg.Close()
		fasthttp.ReleaseResponse(resp)
		g.Dec()
		return false, ErrClientGone
	}
	leg.Began()
	r.copyHead(resp)
	r.p.m.Requests.WithLabelValues(r.mode, statusLabel(resp.StatusCode())).Inc()
	r.obs.Status = resp.StatusCode()
	r.logAt(zerolog.InfoLevel).Str("mode", r.mode).Msg("streaming the decode engine's first answer")
	r.streamBody(r.newSSEBody(er, leg, held, false, func() {
		er.Release()
		leg.Close()
		fasthttp.ReleaseResponse(resp)
		g.Dec()
		r.finish()
	}))
	return false, nil
}
