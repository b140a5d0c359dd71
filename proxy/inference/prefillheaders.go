package inference

import "github.com/valyala/fasthttp"

// PrefillRequest builds a leg to the prefiller carrying body: as upstream
// builds every leg, less --prefill-strip-headers (proxy/prefillstrip).
func (r *Request) PrefillRequest(body []byte) *fasthttp.Request {
	return r.legRequest(r.Prefiller, body, r.P.strip)
}
