package godriver

import (
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/relay"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// Serve runs one inference request on fasthttp's handler goroutine (an
// inference.GoDriver): its admission, its blocking steps run in line, then
// local, a fallback from a refused prefiller, or the split.
func Serve(p *inference.Proxy, rc *fasthttp.RequestCtx, local string, api connectors.API) {
	if !p.Guard.Acquire() {
		p.Overloaded(rc)
		return
	}
	r := relay.NewExchange(p, rc, local, api)
	defer func() {
		if !r.R.Detached {
			r.Finish()
		}
	}()
	a := r.R.Admit(&rc.Request.Header)
	for a.Wait != nil { // a blocking step, run here on the request's goroutine
		a.Wait(r.R.Ctx)()
		a = r.R.Admit(&rc.Request.Header)
	}
	switch a.Route {
	case core.RouteFail:
		r.Fail(a.Err)
	case core.RouteFallback:
		refused(r, a.Err)
	case core.RouteLocal:
		serveLocal(r)
	default:
		Split(r)
	}
}

// serveLocal runs a request that no prefiller prefills (none named, or
// its split declined) on the local engine, its body as the request
// features edit it (a KV cache source named, for one).
func serveLocal(r *relay.Exchange) {
	body, err := r.R.EditLocal(r.R.Body)
	if err != nil {
		r.Fail(fmt.Errorf("%w: %w", core.ErrBadRequest, err))
		return
	}
	r.Fail(relay.Decode(r, body, false)) // chunked when --decode-chunk-tokens says so
}

// refused serves a request whose named prefiller is refused by the
// split's rule (split.Refused): a local prefill with the original body,
// counted and logged with its reason; or, with --prefill-fallback=false
// (or a reason that is no degradation), the error answered.
func refused(r *relay.Exchange, cause error) {
	if r.R.Gone() {
		r.Fail(cause)
		return
	}
	for _, a := range split.Refused(r.R.P.SplitConfig(), cause) {
		switch a.Op {
		case split.SendLocal:
			r.Fail(relay.Decode(r, r.R.Body, false)) // chunked when --decode-chunk-tokens says so
		case split.Fail:
			r.Fail(a.Err)
		default:
			r.R.Account(a)
		}
	}
}
