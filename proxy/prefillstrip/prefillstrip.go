// Package prefillstrip is --prefill-strip-headers: the client headers
// removed from every leg sent to a prefiller. Every leg carries the
// client's end-to-end headers, Authorization, Cookie and X-Api-Key
// included, as llm-d's legs do: a prefill engine may authenticate requests
// as the decode engine does (vLLM's --api-key), and the request is the
// client's. So the credentials go to whichever prefiller the request
// names; with --enable-ssrf-protection only allowlisted ones.
// --prefill-strip-headers removes named headers from every leg sent to a
// prefiller (the first attempt, its retries, a concurrent connector's
// prefill leg, on both serving paths), never from the local engine's legs.
// The sidecar's own legs to prefillers (prewarm, bootstrap /query, encoder
// legs) carry no client header to begin with.
//
// The package checks the names, and removes them from a leg's head
// fasthttp builds (Strip) or tells the lane's head writer which to leave
// out (Stripped); building the legs is the proxy's.
package prefillstrip

import (
	"fmt"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/passpolicy"
)

// keptForLegs are the headers a leg needs, which --prefill-strip-headers
// may not remove: the sidecar sets the first three on every leg, and
// engines refuse a JSON body without its Content-Type (vLLM answers 400).
var keptForLegs = []string{"host", "content-length", "x-request-id", "content-type", "transfer-encoding"}

// Validate checks the names of --prefill-strip-headers.
func Validate(names []string) error {
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

// Names returns names in lower case, for Stripped and Strip.
func Names(names []string) []string {
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
		if equalFold([]byte(s), l) {
			return true
		}
	}
	return false
}

// Stripped reports whether the header named k is one of strip (lower
// case), in any letter case.
func Stripped(k []byte, strip []string) bool {
	for _, s := range strip {
		if equalFold(k, s) {
			return true
		}
	}
	return false
}

// Strip removes the headers named in strip (lower case) from a prefill
// leg's head h (every copy; Cookie's parsed cookies too).
func Strip(h *fasthttp.RequestHeader, strip []string) {
	for _, s := range strip {
		h.Del(s)
	}
}

// equalFold reports whether b is s, ASCII case-insensitively; s is lower
// case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}
