package inference

import (
	"fmt"
	"net/http"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/failure"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// ErrKVAddressDenied: --trust-client-kv-params keeps the client's connector
// fields, SSRF protection is on, and one names an address that is not on
// the allowlist (403, as a denied prefiller header).
var ErrKVAddressDenied error = failure.New("a kv transfer address in the request body is not an allowed prefiller", failure.Outcome{Status: http.StatusForbidden, Precedence: precedenceDenied})

// cleanBody is body as it may reach an engine (api: the inference API its
// path serves, 0 for another path): without the client's own connector
// fields (counted by field), or, with --trust-client-kv-params, body itself
// once the addresses those fields name passed the SSRF allowlist; and what
// its top level says (connectors.BodyTop: the stream flags). A body that
// is not a well-formed JSON object is refused (ErrBadRequest, counted as
// malformed; connectors.ValidObject): what an engine would read in it
// cannot be told, and an edited copy would make the engine's error quote
// bytes the client never sent. The body is validated, and its top level
// read, in one pass (connectors.ScanBody); a second is taken only to
// remove fields that are there, or to check their addresses. log gets the
// debug line of a removal (nil: none).
func (p *Proxy) CleanBody(api connectors.API, body []byte, log func() *zerolog.Event) ([]byte, connectors.BodyTop, error) {
	m, g := p.M.Guards, &p.Cfg.Guard
	top, err := connectors.ScanBody(api, body)
	if err != nil {
		m.Rejected.WithLabelValues(metrics.RejectMalformed).Inc()
		return nil, top, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if g.TrustClientKVParams {
		if g.Allowlist == nil {
			return body, top, nil
		}
		field, err := connectors.ClientAddrs(api, body, g.Allowlist.Allowed)
		switch {
		case err != nil:
			m.Rejected.WithLabelValues(metrics.RejectMalformed).Inc()
			return nil, top, fmt.Errorf("%w: %w", ErrBadRequest, err)
		case field != "":
			m.Rejected.WithLabelValues(metrics.RejectSSRF).Inc()
			return nil, top, fmt.Errorf("%w: %s: %w", ErrKVAddressDenied, field, ssrf.ErrDenied)
		}
		return body, top, nil
	}
	if top.Fields == 0 {
		return body, top, nil
	}
	out, removed, err := connectors.StripClientFields(nil, api, body)
	if err != nil {
		m.Rejected.WithLabelValues(metrics.RejectMalformed).Inc()
		return nil, top, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if removed == 0 {
		return body, top, nil
	}
	names := removed.Names()
	for _, f := range names {
		m.Sanitized.WithLabelValues(f).Inc()
	}
	if log != nil {
		if e := log(); e != nil {
			e.Strs("fields", names).Msg("client connector fields removed from the body")
		}
	}
	return out, top, nil
}

// Sanitize makes r.body what may reach an engine (cleanBody): every leg,
// local or split, and every fallback starts from it; and reads the
// request's stream flags, in the same pass over the body.
func (r *Request) Sanitize() error {
	body, top, err := r.P.CleanBody(r.API, r.Body, func() *zerolog.Event { return r.LogAt(zerolog.DebugLevel) })
	if err != nil {
		return err
	}
	r.Body = body
	r.Stream, r.Usage = top.Stream, top.Usage
	return nil
}
