package inference

import "github.com/valyala/fasthttp"

// prefillRequest builds a leg to the prefiller carrying body: as upstream
// builds every leg, less --prefill-strip-headers (proxy/prefillstrip).
func (r *request) prefillRequest(body []byte) *fasthttp.Request {
	return r.legRequest(r.prefiller, body, r.p.strip)
}
