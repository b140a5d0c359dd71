package inference

import (
	"fmt"
	"net/http"

	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"

	"github.com/pd-sidecar/pd-sidecar/failure"
)

// ErrKVAddressDenied: --trust-client-kv-params keeps the client's connector
// fields, SSRF protection is on, and one names an address that is not on
// the allowlist (403, as a denied prefiller header).
var ErrKVAddressDenied error = failure.New("a kv transfer address in the request body is not an allowed prefiller", failure.Outcome{Status: http.StatusForbidden, Precedence: failure.PrecedenceDenied})

// sanitizer is the admitter that sanitizes the body (sanitize).
type sanitizer struct{}

func (sanitizer) admit(r *Request, _ *fasthttp.RequestHeader) (feature.Step, error) {
	return nil, sanitize(r)
}

// sessionReader is the admitter that reads the conversation's session key
// (readSession), with multi-turn KV reuse on.
type sessionReader struct{}

func (sessionReader) admit(r *Request, h *fasthttp.RequestHeader) (feature.Step, error) {
	return nil, readSession(r, h)
}

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

// readSession reads the conversation's session key (multi-turn KV reuse):
// the session header, else the body's conversation_id, which is removed
// from the body whichever names the key, so that no engine sees it. A key
// that is empty, longer than MaxSessionKeyLen or not printable ASCII names
// no session.
func readSession(r *Request, h *fasthttp.RequestHeader) error {
	key := string(h.Peek(r.P.sessionHeader))
	if cid := gjson.GetBytes(r.Body, "conversation_id"); cid.Exists() {
		if key == "" && cid.Type == gjson.String {
			key = cid.Str
		}
		body, err := connectors.EditObject(nil, r.Body, []connectors.Edit{{Key: "conversation_id", Delete: true}})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		r.Body = body
	}
	if key == "" {
		return nil
	}
	if !validSessionKey(key) {
		r.LogAt(zerolog.DebugLevel).Msg("multi-turn: the session key is not 1-256 printable ASCII bytes; no session")
		return nil
	}
	r.session = key
	return nil
}

func validSessionKey(k string) bool {
	if len(k) == 0 || len(k) > MaxSessionKeyLen {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}
