package front

import (
	"errors"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/passpolicy"
)

// What the sidecar itself answers on its ports: /health and /ready on every
// serving port; /metrics (the sidecar's Prometheus metrics, per-prefiller
// labels included) and /debug/pd (per-prefiller addresses, circuits,
// counts, last failures) on the serving ports, or on --metrics-port alone
// when it is set. The requests the passthrough policy refuses are answered
// here too.

// ErrNotOnMetricsPort: a path --metrics-port does not serve (404).
var ErrNotOnMetricsPort = errors.New("the metrics port serves /metrics and /debug/pd only")

// debugPath is the status view's path (status.Path).
const debugPath = "/debug/pd"

// serveOwn answers rc when its path is one of the sidecar's own endpoints on
// a serving port, and reports whether it did. /metrics and /debug/pd are
// not the serving port's when --metrics-port is set: then they are judged
// by the passthrough policy like any other path (the engine's /metrics
// passes, /debug/pd is refused).
func serveOwn(p *inference.Proxy, rc *fasthttp.RequestCtx, local string) bool {
	path := rc.Path()
	switch string(path) {
	case "/health", "/ready":
	case "/metrics":
		if p.Cfg.MetricsPort != 0 {
			return false
		}
	case debugPath:
		if p.Cfg.MetricsPort != 0 || p.Debug == nil {
			return false
		}
	default:
		return false
	}
	if v := p.Pass.Own(string(rc.Method())); !v.Pass() {
		refusePassthrough(p, rc, v)
		return true
	}
	switch string(path) {
	case "/health":
		health(rc)
	case "/ready":
		ready(p, rc, local)
	case "/metrics":
		p.MetricsH(rc)
	default:
		p.Debug(rc)
	}
	return true
}

// health answers /health: the sidecar is alive.
func health(rc *fasthttp.RequestCtx) {
	rc.SetContentType("application/json")
	rc.SetBodyString(`{"status":"ok"}`)
}

// metricsPortHandler serves --metrics-port: /metrics and /debug/pd, GET and
// HEAD; any other path is a 404.
func metricsPortHandler(p *inference.Proxy) fasthttp.RequestHandler {
	return func(rc *fasthttp.RequestCtx) {
		var h fasthttp.RequestHandler
		switch string(rc.Path()) {
		case "/metrics":
			h = p.MetricsH
		case debugPath:
			h = p.Debug // nil: no status view wired
		}
		if h == nil {
			rc.SetStatusCode(fasthttp.StatusNotFound)
			rc.SetContentType("application/json")
			rc.SetBody(core.ErrorBody(fasthttp.StatusNotFound, ErrNotOnMetricsPort))
			return
		}
		if v := p.Pass.Own(string(rc.Method())); !v.Pass() {
			refusePassthrough(p, rc, v)
			return
		}
		h(rc)
	}
}

// refusePassthrough answers a request the passthrough policy refuses, before
// anything is forwarded: an OpenAI-style JSON error (405 with its Allow
// header, or 403) in fixed words, counted in requests_rejected_total,
// logged with the request id, the method and the path (logPath's).
func refusePassthrough(p *inference.Proxy, rc *fasthttp.RequestCtx, v passpolicy.Verdict) {
	reason := metrics.RejectPathNotAllowed
	if v.Status == fasthttp.StatusMethodNotAllowed {
		reason = metrics.RejectMethodNotAllowed
		rc.Response.Header.Set(fasthttp.HeaderAllow, v.Allow)
	}
	p.M.Guards.Rejected.WithLabelValues(reason).Inc()
	id := core.RequestID(rc.Request.Header.Peek(core.HeaderRequestID))
	rc.Response.Header.Set(core.HeaderRequestID, id)
	p.Log.Warn().Err(v.Err).Str("request_id", id).Str("reason", reason).Int("status", v.Status).
		Str("method", logPath(rc.Method())).Str("path", logPath(rc.Path())).
		Str("remote", rc.RemoteAddr().String()).Msg("request rejected")
	rc.SetStatusCode(v.Status)
	rc.SetContentType("application/json")
	rc.SetBody(core.ErrorBody(v.Status, v.Err))
}

// maxLoggedPath bounds a path quoted in a log line.
const maxLoggedPath = 128

// logPath is a client's path (decoded, without its query) or method as a
// log line may quote it: at most maxLoggedPath bytes, each byte that is not
// visible ASCII written %XX, so nothing a client sends can forge a line or
// a terminal escape.
func logPath(b []byte) string {
	const hex = "0123456789ABCDEF"
	var sb strings.Builder
	for _, c := range b {
		if sb.Len() >= maxLoggedPath {
			sb.WriteString("...")
			break
		}
		if c <= ' ' || c >= 0x7f || c == '%' {
			sb.WriteByte('%')
			sb.WriteByte(hex[c>>4])
			sb.WriteByte(hex[c&15])
			continue
		}
		sb.WriteByte(c)
	}
	return sb.String()
}
