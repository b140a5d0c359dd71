package inference

import (
	"net/http"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/proxy/failure"
)

// ErrKVAddressDenied: --trust-client-kv-params keeps the client's connector
// fields, SSRF protection is on, and one names an address that is not on
// the allowlist (403, as a denied prefiller header).
var ErrKVAddressDenied error = failure.New("a kv transfer address in the request body is not an allowed prefiller", failure.Outcome{Status: http.StatusForbidden, Precedence: precedenceDenied})

// sanitize makes r.Body what may reach an engine (CleanBody): every leg,
// local or split, and every fallback starts from it; and reads the
// request's stream flags, in the same pass over the body.
func sanitize(r *Request) error {
	body, top, err := r.P.CleanBody(r.API, r.Body, func() *zerolog.Event { return r.LogAt(zerolog.DebugLevel) })
	if err != nil {
		return err
	}
	r.Body = body
	r.Stream, r.Usage = top.Stream, top.Usage
	return nil
}
