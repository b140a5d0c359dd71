package proxy

import (
	"fmt"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/passpolicy"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
)

// Client headers on prefill legs. Every leg carries the client's
// end-to-end headers, Authorization, Cookie and X-Api-Key included, as
// llm-d's legs do: a prefill engine may authenticate requests as the
// decode engine does (vLLM's --api-key), and the request is the client's.
// So the credentials go to whichever prefiller the request names; with
// --enable-ssrf-protection only allowlisted ones. --prefill-strip-headers
// removes named headers from every leg sent to a prefiller (the first
// attempt, its retries, a concurrent connector's prefill leg, on both
// serving paths), never from the local engine's legs. The sidecar's own
// legs to prefillers (prewarm, bootstrap /query, encoder legs) carry no
// client header to begin with.

// keptForLegs are the headers a leg needs, which --prefill-strip-headers
// may not remove: the sidecar sets the first three on every leg, and
// engines refuse a JSON body without its Content-Type (vLLM answers 400).
var keptForLegs = []string{"host", "content-length", "x-request-id", "content-type", "transfer-encoding"}

// validStripHeaders checks the names of --prefill-strip-headers.
func validStripHeaders(names []string) error {
	for _, n := range names {
		switch {
		case !passpolicy.IsToken(n):
			return fmt.Errorf("--prefill-strip-headers %q is not a header name", n)
		case containsFold(keptForLegs, n):
			return fmt.Errorf("--prefill-strip-headers %s: every leg needs it (the sidecar sets Host, Content-Length and X-Request-Id; engines refuse a JSON body without its Content-Type)", n)
		}
	}
	return nil
}

// stripNames returns names in lower case, for rawhttp.AppendLegStartStrip.
func stripNames(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, strings.ToLower(n))
	}
	return out
}

// containsFold reports whether list (lower case) holds s in any letter
// case.
func containsFold(list []string, s string) bool {
	for _, l := range list {
		if rawhttp.EqualFold([]byte(s), l) {
			return true
		}
	}
	return false
}

// stripPrefillHeaders removes --prefill-strip-headers from a prefill leg's
// head h (every copy; Cookie's parsed cookies too).
func stripPrefillHeaders(h *fasthttp.RequestHeader, strip []string) {
	for _, s := range strip {
		h.Del(s)
	}
}

// prefillRequest builds a leg to the prefiller carrying body: as upstream
// builds every leg, less --prefill-strip-headers.
func (r *request) prefillRequest(body []byte) *fasthttp.Request {
	return r.legRequest(r.prefiller, body, r.p.strip)
}
