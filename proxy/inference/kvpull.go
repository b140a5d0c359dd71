package inference

import (
	"context"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// engineCall POSTs a JSON body to path on the local engine local, under
// the request id id: the answer's body and status (kvpull.Feature.Call).
func (p *Proxy) engineCall(ctx context.Context, local, id, path string, body []byte) ([]byte, int, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(path)
	req.Header.SetHost(local)
	req.Header.SetContentType("application/json")
	req.Header.Set(HeaderRequestID, id)
	req.SetBodyRaw(body)
	hold, err := p.Tr.Do(ctx, local, req, resp)
	defer hold.Release() // resp is let go on return; the copy returned is small JSON
	if err != nil {
		return nil, 0, err
	}
	return append([]byte(nil), resp.Body()...), resp.StatusCode(), nil
}

// engineCallErr names a failed engineCall to local as the local engine's
// upstream failure.
func engineCallErr(local string, err error) error {
	return upstreamErr(upstream.RoleEngine, local, err)
}
