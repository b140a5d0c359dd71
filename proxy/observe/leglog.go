package observe

import (
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// At trace level (--log-level trace, or llm-d's --zap-log-level 5 and
// above) every leg the proxy sends is logged with its head and body, as
// llm-d's V(5) logs the prefill and decode bodies: a debugging mode, for
// it logs prompts. Credentials never reach the log: the values of
// credential headers are replaced. The lane, which builds its legs as raw
// bytes, is off at trace level, so that every leg passes through LogLeg.

// maxLoggedBody bounds the body bytes one trace line carries.
const maxLoggedBody = 64 << 10

// redactedHeaders are the headers whose values a trace line never shows.
var redactedHeaders = []string{"authorization", "proxy-authorization", "cookie", "x-api-key"} // lower case (equalFold)

// LogsLegs reports whether legs are logged by a logger of level: at trace
// level, when the global level lets it through too.
func LogsLegs(level zerolog.Level) bool {
	return level <= zerolog.TraceLevel && zerolog.GlobalLevel() <= zerolog.TraceLevel
}

// LogLeg writes on e (a trace-level event of the request's logger; nil:
// nothing) the leg req to addr: its method, target, head with credentials
// redacted and body, cut at 64 KiB.
func LogLeg(e *zerolog.Event, addr string, req *fasthttp.Request) {
	if e == nil {
		return
	}
	h := zerolog.Dict()
	for k, v := range req.Header.All() {
		val := string(v)
		for _, name := range redactedHeaders {
			if len(k) == len(name) && equalFold(k, name) {
				val = "[redacted]"
				break
			}
		}
		h.Str(string(k), val)
	}
	body := req.Body()
	if len(body) > maxLoggedBody {
		e.Int("body_bytes", len(body))
		body = body[:maxLoggedBody]
	}
	e.Str("leg", addr).Str("method", string(req.Header.Method())).Str("uri", string(req.Header.RequestURI())).
		Dict("headers", h).Str("body", string(body)).Msg("leg sent")
}
