// Package sanitize makes a request body what may reach an engine: a
// well-formed JSON object that every decoder reads the same way, without
// the client's own connector fields (or, when they are trusted, with only
// allowed addresses in them). Cleaner does it for every body the sidecar
// forwards, and is the admitter (proxy/feature) that does it for an
// inference request's, which every leg, local or split, and every fallback
// starts from.
package sanitize

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// ErrKVAddressDenied: --trust-client-kv-params keeps the client's connector
// fields, SSRF protection is on, and one names an address that is not on
// the allowlist (403, as a denied prefiller header).
var ErrKVAddressDenied error = failure.New("a kv transfer address in the request body is not an allowed prefiller", failure.Outcome{Status: http.StatusForbidden, Precedence: failure.PrecedenceDenied})

// Cleaner cleans request bodies. Every field is required but Allowlist.
type Cleaner struct {
	// TrustClientKVParams keeps the client's connector fields
	// (--trust-client-kv-params), once the addresses they name passed
	// Allowlist.
	TrustClientKVParams bool
	// Allowlist admits the addresses of trusted connector fields
	// (--enable-ssrf-protection); nil admits any.
	Allowlist ssrf.Allowlist
	// Guards count the bodies refused (Rejected) and the fields removed
	// (Sanitized).
	Guards *metrics.Guards
	// BadRequest is the error a body that is not a well-formed object is
	// wrapped in (the request path's 400).
	BadRequest error
}

// Admit makes a's body what may reach an engine (Clean) and reads its
// stream flags, in the same pass over the body.
func (c *Cleaner) Admit(a *feature.Admission, _ feature.Head) (feature.Step, error) {
	body, top, err := c.Clean(a.API, a.Body, func() *zerolog.Event { return a.Log.LogAt(zerolog.DebugLevel) })
	if err != nil {
		return nil, err
	}
	a.Body = body
	a.Stream, a.Usage = top.Stream, top.Usage
	return nil, nil
}

// Clean is body as it may reach an engine (api: the inference API its
// path serves, 0 for another path): without the client's own connector
// fields (counted by field), or, with TrustClientKVParams, body itself
// once the addresses those fields name passed the allowlist; and what its
// top level says (connectors.BodyTop: the stream flags). A body that is
// not a well-formed JSON object is refused (BadRequest, counted as
// malformed; connectors.ValidObject): what an engine would read in it
// cannot be told, and an edited copy would make the engine's error quote
// bytes the client never sent. So is one that decoders read differently
// (connectors.ErrAmbiguousJSON, counted as ambiguous_json): a repeated
// name, a case variant of a name the sidecar reads, a lone surrogate —
// what the sidecar reads of it is then exactly what the engine reads. The
// body is validated, and its top level read, in one pass
// (connectors.ScanBody); a second is taken only to remove fields that are
// there, or to check their addresses. log gets the debug line of a
// removal (nil: none).
func (c *Cleaner) Clean(api connectors.API, body []byte, log func() *zerolog.Event) ([]byte, connectors.BodyTop, error) {
	m := c.Guards
	top, err := connectors.ScanBody(api, body)
	if err != nil {
		reason := metrics.RejectMalformed
		if errors.Is(err, connectors.ErrAmbiguousJSON) {
			reason = metrics.RejectAmbiguousJSON
		}
		m.Rejected.WithLabelValues(reason).Inc()
		return nil, top, fmt.Errorf("%w: %w", c.BadRequest, err)
	}
	if c.TrustClientKVParams {
		if c.Allowlist == nil {
			return body, top, nil
		}
		field, err := connectors.ClientAddrs(api, body, c.Allowlist.Allowed)
		switch {
		case err != nil:
			m.Rejected.WithLabelValues(metrics.RejectMalformed).Inc()
			return nil, top, fmt.Errorf("%w: %w", c.BadRequest, err)
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
		return nil, top, fmt.Errorf("%w: %w", c.BadRequest, err)
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
