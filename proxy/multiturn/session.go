package multiturn

import (
	"fmt"

	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// MaxSessionKeyLen bounds a session key (header or conversation_id).
const MaxSessionKeyLen = 256

// SessionReader is the admitter that reads a request's conversation
// session key, which narrows the search for its history (Feature), while
// multi-turn KV reuse is on.
type SessionReader struct {
	// Header names the session key's header
	// (--bidirectional-session-header).
	Header string
	// BadRequest is the error a body conversation_id cannot be removed
	// from is wrapped in (the request path's 400).
	BadRequest error
}

// Admit reads a's session key: the session header, else the body's
// conversation_id, which is removed from the body whichever names the
// key, so that no engine sees it. A key that is empty, longer than
// MaxSessionKeyLen or not printable ASCII names no session.
func (s SessionReader) Admit(a *feature.Admission, h feature.Head) (feature.Step, error) {
	key := string(h.Peek(s.Header))
	if cid := gjson.GetBytes(a.Body, "conversation_id"); cid.Exists() {
		if key == "" && cid.Type == gjson.String {
			key = cid.Str
		}
		body, err := connectors.EditObject(nil, a.Body, []connectors.Edit{{Key: "conversation_id", Delete: true}})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", s.BadRequest, err)
		}
		a.Body = body
	}
	if key == "" {
		return nil, nil
	}
	if !validSessionKey(key) {
		a.Log.LogAt(zerolog.DebugLevel).Msg("multi-turn: the session key is not 1-256 printable ASCII bytes; no session")
		return nil, nil
	}
	a.Session = key
	return nil, nil
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
